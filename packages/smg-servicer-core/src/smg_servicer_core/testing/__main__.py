"""``python -m smg_servicer_core.testing``: serve the fake engine as a real process.

Used by the lifecycle tests (real signals, real exit codes) and by ``tools/bench``. Takes the
shared server flags (metrics: ``--metrics-port`` / ``SMG_FAKE_SERVICER_METRICS_PORT``) plus
fake-engine knobs; ``--port-file`` receives the bound port once the
server listens (useful with ``--port 0``). ``--engine-process`` starts a child process standing in
for an engine's worker (its PID is logged; the engine's shutdown stops it), so the bounded
shutdown has a process to kill when ``--shutdown-delay-s`` outlasts the deadline.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import subprocess
import sys
from collections.abc import Generator
from pathlib import Path

from smg_servicer_core.cli import (
    resolve_server,
    server_options,
    server_parser,
    start_metrics,
    tracing_from,
)
from smg_servicer_core.config import environment
from smg_servicer_core.entry import configure_logging, run_main
from smg_servicer_core.health import HealthFrame
from smg_servicer_core.server import serve
from smg_servicer_core.stream import coalescing
from smg_servicer_core.testing.fake_engine import FakeEngine, FakeScript
from smg_servicer_core.testing.fake_servicer import SERVICE_NAME, FakeEngineServicer
from smg_servicer_core.testing.process import announce_port

logger = logging.getLogger("smg_servicer_core.testing")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m smg_servicer_core.testing", parents=[server_parser("fake")]
    )
    parser.add_argument("--tokenizer-path", default=None)
    parser.add_argument("--first-token-delay-ms", type=float, default=0.0)
    parser.add_argument("--token-delay-ms", type=float, default=0.0)
    parser.add_argument("--ready-delay-s", type=float, default=0.0)
    parser.add_argument("--shutdown-delay-s", type=float, default=0.0)
    parser.add_argument("--port-file", type=Path, default=None)
    parser.add_argument("--engine-process", action="store_true")
    return parser


@contextlib.contextmanager
def _engine_process(wanted: bool) -> Generator[None]:
    if not wanted:
        yield
        return
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
    logger.info("engine process %d started", child.pid)
    try:
        yield
    finally:
        child.terminate()
        child.wait(10)


async def _main(args: argparse.Namespace) -> int:
    resolved = resolve_server(args, environment(), "fake")
    options = server_options(resolved)  # reads the TLS files: a bad one is exit 2, one line
    configure_logging(resolved["log_level"])
    logger.info("settings: %s", resolved.describe())
    engine = FakeEngine(
        script=FakeScript(
            first_token_delay_s=args.first_token_delay_ms / 1000.0,
            token_delay_s=args.token_delay_ms / 1000.0,
        ),
        ready_delay_s=args.ready_delay_s,
        shutdown_delay_s=args.shutdown_delay_s,
        coalesce=coalescing(),
    )
    health = HealthFrame(SERVICE_NAME)
    metrics = start_metrics(resolved, tls=options.tls)
    servicer = FakeEngineServicer(
        engine,
        health,
        tokenizer_path=args.tokenizer_path,
        metrics=metrics[0] if metrics else None,
    )
    servicer.attach_tracing(tracing_from(resolved, "smg-servicer-fake"))

    def announce(port: int) -> None:
        if args.port_file is not None:
            announce_port(args.port_file, port)

    with _engine_process(args.engine_process):
        return await serve(
            [servicer.binding()],
            health,
            engine,
            options,
            on_started=announce,
            in_flight=lambda: len(servicer.registry),
            metrics_server=metrics[1] if metrics else None,
        )


def main() -> None:
    args = _parser().parse_args()
    run_main(lambda: _main(args), "smg-servicer-fake")


if __name__ == "__main__":
    main()

"""``python -m smg_servicer_sglang [servicer flags] <SGLang server flags>``: the servicer without
SGLang's launcher.

The servicer's own flags come first and are taken out (``--grace-period``, ``--metrics-port``,
``--metrics-host``, ``--servicer-impl``, ``--shutdown-margin``, ``--lora-allowed-dirs``; each also
read from its variable, see ``server.servicer_settings``);
everything else is exactly the flags of ``sglang serve`` (``--model-path``, ``--host``,
``--port``, ...). It serves ``SglangScheduler`` on ``--host:--port``, like
``sglang serve --smg-grpc-mode`` minus SGLang's HTTP sidecar. ``--help`` prints both sets.
Exit codes (core's ``ExitCode``): 0 stopped by a signal, 1 a scheduler failed, 2 bad flags.
"""

from __future__ import annotations

import argparse
import sys

from smg_servicer_core.cli import own_flags_parser, split_launcher_args
from smg_servicer_core.entry import ExitCode, run_main
from smg_servicer_core.errors import ConfigError
from smg_servicer_sglang import _sglang as sg
from smg_servicer_sglang.server import resolve_settings, run, servicer_settings

PROG = "smg_servicer_sglang"


def own_parser() -> argparse.ArgumentParser:
    return own_flags_parser(PROG, servicer_settings(), "SGLang")


def main(argv: list[str] | None = None) -> None:
    own, rest = split_launcher_args(own_parser(), sys.argv[1:] if argv is None else argv, "SGLang")
    try:
        settings = resolve_settings(own)
        server_args = sg.prepare_server_args(rest)
    except (ConfigError, ValueError, TypeError) as exc:
        print(f"{PROG}: configuration error: {exc}", file=sys.stderr)
        sys.exit(ExitCode.CONFIG)
    run_main(lambda: run(server_args, settings=settings), PROG)


if __name__ == "__main__":
    main()

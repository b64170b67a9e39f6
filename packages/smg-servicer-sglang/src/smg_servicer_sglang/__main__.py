"""``python -m smg_servicer_sglang <SGLang server flags>``: the servicer without SGLang's launcher.

Takes exactly the flags of ``sglang serve`` (``--model-path``, ``--host``, ``--port``, ...) and
serves ``SglangScheduler`` on ``--host:--port``, like ``sglang serve --smg-grpc-mode`` minus
SGLang's HTTP sidecar. Exit codes: 0 stopped by a signal, 1 a scheduler failed, 2 bad flags.
"""

from __future__ import annotations

import sys

from smg_servicer_core.entry import run_main
from smg_servicer_sglang import _sglang as sg
from smg_servicer_sglang.server import run


def main(argv: list[str] | None = None) -> None:
    try:
        server_args = sg.prepare_server_args(sys.argv[1:] if argv is None else argv)
    except (ValueError, TypeError) as exc:
        print(f"smg_servicer_sglang: configuration error: {exc}", file=sys.stderr)
        sys.exit(2)
    run_main(lambda: run(server_args), "smg_servicer_sglang")


if __name__ == "__main__":
    main()

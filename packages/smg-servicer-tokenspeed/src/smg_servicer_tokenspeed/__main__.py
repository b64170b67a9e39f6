"""``python -m smg_servicer_tokenspeed [servicer flags] <TokenSpeed server flags>``.

The servicer's own flags come first and are taken out (``--grace-period``, ``--metrics-port``,
``--metrics-host``; each also read from its variable, see :mod:`smg_servicer_tokenspeed.settings`);
everything else goes to TokenSpeed's ``prepare_server_args`` (``--model``, ``--host``,
``--port``, ...). ``--help`` prints both sets. ``ts serve`` runs this module through the facade
(``python -m smg_grpc_servicer.tokenspeed``). Exit codes (core's ``ExitCode``): 0 stopped by a
signal, 1 the engine failed, 2 bad flags or variables.
"""

from __future__ import annotations

import argparse
import sys

from smg_servicer_core.entry import ExitCode, run_main
from smg_servicer_core.errors import ConfigError
from smg_servicer_tokenspeed.settings import resolve_settings, servicer_settings

PROG = "smg_servicer_tokenspeed"


def own_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=f"python -m {PROG}", add_help=False)
    group = parser.add_argument_group("servicer (before the TokenSpeed flags)")
    for setting in servicer_settings():
        setting.add_to_parser(group)
    return parser


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    parser = own_parser()
    own, rest = parser.parse_known_args(args)
    if "-h" in rest or "--help" in rest:
        parser.print_help()
        print("\nTokenSpeed server flags:")
    try:
        settings = resolve_settings(own)
    except ConfigError as exc:
        print(f"{PROG}: configuration error: {exc}", file=sys.stderr)
        sys.exit(ExitCode.CONFIG)
    try:
        from smg_servicer_tokenspeed import _tokenspeed as ts  # noqa: PLC0415
        from smg_servicer_tokenspeed.server import run  # noqa: PLC0415
    except ImportError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        sys.exit(ExitCode.CONFIG)
    try:
        server_args = ts.prepare(rest)
    except (ValueError, TypeError) as exc:
        print(f"{PROG}: configuration error: {exc}", file=sys.stderr)
        sys.exit(ExitCode.CONFIG)
    run_main(lambda: run(server_args, settings=settings), PROG)


if __name__ == "__main__":
    main()

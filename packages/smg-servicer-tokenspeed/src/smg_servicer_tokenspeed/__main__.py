"""``python -m smg_servicer_tokenspeed [servicer flags] <TokenSpeed server flags>``.

The servicer's own flags come first and are taken out (``--grace-period``, ``--metrics-port``,
``--metrics-host``, ``--servicer-impl``; each also read from its variable, see
:mod:`smg_servicer_tokenspeed.settings`; ``rust`` serves through :mod:`.rust_lane`);
everything else goes to TokenSpeed's ``prepare_server_args`` (``--model``, ``--host``,
``--port``, ...). ``--help`` prints both sets. ``ts serve`` runs this module through the facade
(``python -m smg_grpc_servicer.tokenspeed``). Exit codes (core's ``ExitCode``): 0 stopped by a
signal, 1 the engine failed, 2 bad flags or variables.
"""

from __future__ import annotations

import argparse
import sys

from smg_servicer_core.cli import own_flags_parser, split_launcher_args
from smg_servicer_core.entry import ExitCode, run_main
from smg_servicer_core.errors import ConfigError
from smg_servicer_tokenspeed import forks
from smg_servicer_tokenspeed.settings import SERVICER_IMPL, resolve_settings, servicer_settings

PROG = "smg_servicer_tokenspeed"


def own_parser() -> argparse.ArgumentParser:
    return own_flags_parser(PROG, servicer_settings(), "TokenSpeed")


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    own, rest = split_launcher_args(own_parser(), args, "TokenSpeed")
    try:
        settings = resolve_settings(own)
    except ConfigError as exc:
        print(f"{PROG}: configuration error: {exc}", file=sys.stderr)
        sys.exit(ExitCode.CONFIG)
    if settings[SERVICER_IMPL.name] == "rust":
        from smg_servicer_core.entry import configure_logging  # noqa: PLC0415
        from smg_servicer_tokenspeed import rust_lane  # noqa: PLC0415

        configure_logging("info")
        sys.exit(rust_lane.run(rest, settings))
    try:
        from smg_servicer_tokenspeed import _tokenspeed as ts  # noqa: PLC0415
        from smg_servicer_tokenspeed.server import run  # noqa: PLC0415
    except ImportError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        sys.exit(ExitCode.CONFIG)
    # Installed over TokenSpeed's runtime (the seed's line): say once how to make pip's records
    # agree (forks.py says why pip cannot do it by itself).
    overlap = forks.notice(forks.shared_files())
    if overlap:
        print(f"{PROG}: {overlap}", file=sys.stderr)
    try:
        server_args = ts.prepare(rest)
    except (ValueError, TypeError) as exc:
        print(f"{PROG}: configuration error: {exc}", file=sys.stderr)
        sys.exit(ExitCode.CONFIG)
    run_main(lambda: run(server_args, settings=settings), PROG)


if __name__ == "__main__":
    main()

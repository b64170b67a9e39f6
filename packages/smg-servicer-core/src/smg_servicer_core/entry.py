"""Entry-point helpers: logging set-up and the exit-code contract of every launcher.

- exit 0: stopped by SIGTERM/SIGINT after draining;
- exit 1: the engine died or failed to start;
- exit 2: a configuration error, reported as one line on stderr with no traceback.

Only entry points call :func:`configure_logging`; library modules just use
``logging.getLogger(__name__)``.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Callable, Coroutine
from enum import IntEnum
from typing import Any, NoReturn

from smg_servicer_core.config import Setting, parse_bool, setting_value
from smg_servicer_core.errors import ConfigError


class ExitCode(IntEnum):
    """The one exit-code table of every launcher."""

    OK = 0  # stopped by a signal after draining
    ENGINE_DIED = 1  # the engine died or could not start
    CONFIG = 2  # a bad flag, variable or file; one line on stderr


EXIT_OK = ExitCode.OK
EXIT_ENGINE_DIED = ExitCode.ENGINE_DIED
EXIT_CONFIG = ExitCode.CONFIG

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

UVLOOP = Setting(
    "uvloop", parse_bool, True, "run on uvloop when installed", env="SMG_SERVICER_UVLOOP"
)


def configure_logging(level: str = "info") -> None:
    logging.basicConfig(level=level.upper(), format=LOG_FORMAT, stream=sys.stderr, force=True)


def _runner() -> Callable[[Coroutine[Any, Any, int]], int]:
    """uvloop when it is installed (vLLM's own launcher runs on it; it cuts the servicer's CPU
    per streamed token by about 15 %), else asyncio. ``SMG_SERVICER_UVLOOP=0`` opts out."""
    if not setting_value(UVLOOP):
        return asyncio.run
    try:
        import uvloop  # noqa: PLC0415 - optional accelerator
    except ImportError:
        return asyncio.run
    run: Callable[[Coroutine[Any, Any, int]], int] = uvloop.run
    return run


def run_main(main: Callable[[], Coroutine[Any, Any, int]], prog: str) -> NoReturn:
    """Run ``main`` on a fresh event loop and exit with its code (2 on ConfigError)."""
    try:
        code = _runner()(main())
    except ConfigError as exc:
        print(f"{prog}: configuration error: {exc}", file=sys.stderr)
        sys.exit(EXIT_CONFIG)
    except KeyboardInterrupt:
        code = EXIT_OK
    sys.exit(code)

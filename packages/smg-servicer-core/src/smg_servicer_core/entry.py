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
from typing import Any, NoReturn

from smg_servicer_core.errors import ConfigError

EXIT_OK = 0
EXIT_ENGINE_DIED = 1
EXIT_CONFIG = 2

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def configure_logging(level: str = "info") -> None:
    logging.basicConfig(level=level.upper(), format=LOG_FORMAT, stream=sys.stderr, force=True)


def run_main(main: Callable[[], Coroutine[Any, Any, int]], prog: str) -> NoReturn:
    """Run ``main`` on a fresh event loop and exit with its code (2 on ConfigError)."""
    try:
        code = asyncio.run(main())
    except ConfigError as exc:
        print(f"{prog}: configuration error: {exc}", file=sys.stderr)
        sys.exit(EXIT_CONFIG)
    except KeyboardInterrupt:
        code = EXIT_OK
    sys.exit(code)

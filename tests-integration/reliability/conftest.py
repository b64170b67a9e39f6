"""One shared worker per engine for the checks that leave it running (fuzz, cancel storm, slow
reader); the checks that end a worker (drain, engine death) start their own."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from smg_it.reliability import ENGINES, Target, running
from smg_servicer_core.testing.requests import Wire


@pytest.fixture(scope="session", params=ENGINES)
def engine(request: pytest.FixtureRequest) -> Wire:
    return request.param


@pytest.fixture(scope="session")
def shared(engine: Wire, tiny_model: Path) -> Iterator[Target]:
    with running(engine, tiny_model) as target:
        yield target

"""One shared worker per engine: the fuzz, the cancel storm, the slow reader, then the drain, which
ends it (so it runs last for its engine; see ``pytest_collection_modifyitems``). Engine death
kills an engine, so it starts a worker of its own."""

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


#: Within one engine's checks, in this order (the drain ends the shared worker).
ORDER = (
    "test_fuzz",
    "test_cancel_storm",
    "test_slow_reader",
    "test_kv_faults",
    "test_engine_death",
    "test_drain",
)


def _key(item: pytest.Item) -> tuple[int, int]:
    params = getattr(getattr(item, "callspec", None), "params", {})
    engine = params.get("engine", params.get("victim"))
    rank = ENGINES.index(engine) if engine in ENGINES else len(ENGINES)
    module = Path(str(item.fspath)).stem
    return rank, ORDER.index(module) if module in ORDER else len(ORDER)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Group this suite's checks by engine, each engine's in :data:`ORDER`; the suite's items
    keep the places they had among the session's other items."""
    here = Path(__file__).parent
    slots = [i for i, item in enumerate(items) if Path(str(item.fspath)).parent == here]
    ordered = sorted((items[i] for i in slots), key=_key)
    for slot, item in zip(slots, ordered, strict=True):
        items[slot] = item

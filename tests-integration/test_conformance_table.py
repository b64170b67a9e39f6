"""The lane conformance table (smg_it.conformance) is whole, and the README's lane table says what
it says: its bad-input row is generated from it. Each lane's test holds the lane to it through the
real router (test_router.py: the Python lanes; test_rust_lane.py, test_sglang_rust_lane.py and
TokenSpeed's engine/test_rust_lane.py: the Rust lanes; test_vllm_zmq_lane.py,
test_sglang_zmq_lane.py and TokenSpeed's engine/test_zmq_lane.py: the ZMQ lanes)."""

from __future__ import annotations

import pytest

from smg_it import conformance
from smg_it.paths import REPO

pytestmark = pytest.mark.unit


def test_every_case_of_every_lane_and_engine_has_an_answer() -> None:
    assert sorted(conformance.TABLE) == sorted(
        (lane, engine) for lane in conformance.LANES for engine in conformance.ENGINES
    )
    for answers in conformance.TABLE.values():
        assert sorted(answers) == sorted(conformance.CASES)


def test_the_readme_row_is_the_tables() -> None:
    """Regenerate it with ``uv run python -c 'from smg_it.conformance import readme_row;
    print(readme_row())'`` (run from tests-integration/)."""
    row = conformance.readme_row()
    lines = (REPO / "README.md").read_text().splitlines()
    ours = [line for line in lines if line.startswith("| input the engine cannot take")]
    assert ours == [row]

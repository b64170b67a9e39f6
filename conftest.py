"""The checkout's root pytest configuration, loaded in every test environment (the workspace's
``.venv``, ``.venv-sglang`` and ``.venv-tokenspeed``: all run from this folder, see
``tools/envs/list``). ``pythonpath`` in ``pyproject.toml`` puts the test kit (``smg_it``, in
``tests-integration/``) on the path; its shared fixtures are registered here, every collected
test must carry one tier marker, and a test environment must hold the engine releases
``tools/envs/list`` says it runs (what each session ran is kept for the compatibility table:
:mod:`smg_it.compat`)."""

from __future__ import annotations

import os

import pytest

from smg_it import compat

pytest_plugins = ["smg_it.fixtures"]

#: Set by the outermost pytest session of a process tree: a pytest that a test starts (for
#: example tools/test_tiers.py's collections) inherits it and records nothing of its own.
OUTER = "SMG_PYTEST_OUTER_PID"
NESTED = OUTER in os.environ  # noqa: TID251 - the process tree's own marker
os.environ.setdefault(OUTER, str(os.getpid()))  # noqa: TID251

#: The tiers of ``[tool.pytest.ini_options] markers``: every test carries at least one.
TIERS = ("unit", "contract", "engine", "integration", "reliability", "conformance")


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Fail the run (a usage error, before anything runs) on a test without a tier marker; every
    collected test counts, whatever ``-m`` or ``-k`` deselect afterwards."""
    wrong = compat.check_environment(compat.current_env())
    if wrong:
        raise pytest.UsageError("; ".join(wrong))
    untiered = [item.nodeid for item in items if not any(item.get_closest_marker(t) for t in TIERS)]
    if untiered:
        listed = "\n  ".join(untiered)
        raise pytest.UsageError(
            f"{len(untiered)} test(s) carry no tier marker (one of {', '.join(TIERS)}):\n  {listed}"
        )


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Record the session's outcome on its environment's declared releases."""
    env = compat.current_env()
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if env is None or reporter is None or NESTED:
        return
    stats = reporter.stats
    failed = len(stats.get("failed", [])) + len(stats.get("error", []))
    args = [str(a) for a in session.config.invocation_params.args]
    compat.record_session(env, len(stats.get("passed", [])), failed, int(exitstatus), args)

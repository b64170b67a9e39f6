"""The checkout's root pytest configuration, loaded in every test environment (the workspace's
``.venv``, ``.venv-sglang`` and ``.venv-tokenspeed``: all run from this folder, see
``tools/envs/list``). ``pythonpath`` in ``pyproject.toml`` puts the test kit (``smg_it``, in
``tests-integration/``) on the path; its shared fixtures are registered here, and every
collected test must carry one tier marker."""

from __future__ import annotations

import pytest

pytest_plugins = ["smg_it.fixtures"]

#: The tiers of ``[tool.pytest.ini_options] markers``: every test carries at least one.
TIERS = ("unit", "contract", "engine", "integration", "reliability", "conformance")


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Fail the run (a usage error, before anything runs) on a test without a tier marker; every
    collected test counts, whatever ``-m`` or ``-k`` deselect afterwards."""
    untiered = [item.nodeid for item in items if not any(item.get_closest_marker(t) for t in TIERS)]
    if untiered:
        listed = "\n  ".join(untiered)
        raise pytest.UsageError(
            f"{len(untiered)} test(s) carry no tier marker (one of {', '.join(TIERS)}):\n  {listed}"
        )

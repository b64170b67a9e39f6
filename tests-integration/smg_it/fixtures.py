"""The fixtures every suite shares, registered for all three test environments by the root
``conftest.py`` (``pytest_plugins``): the float32 tiny text model and the tiny VLM, each built
once per machine under ``.cache/models`` (``SMG_MODEL_CACHE`` overrides).

Imports only what the engine-free packages' Python 3.10 runs have (``tools/pyversions.sh``).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from smg_it.paths import model_cache


@pytest.fixture(scope="session")
def tiny_model() -> Path:
    """The float32 tiny Llama (core's factory)."""
    from smg_servicer_core.testing import cached_tiny_model

    return cached_tiny_model(model_cache())


@pytest.fixture(scope="session")
def tiny_vlm() -> Path:
    """The float32 tiny Idefics3 (core's factory)."""
    from smg_servicer_core.testing.tiny_vlm import cached_tiny_vlm

    return cached_tiny_vlm(model_cache())

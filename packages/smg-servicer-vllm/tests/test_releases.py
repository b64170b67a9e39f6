"""The capability checks of :mod:`smg_servicer_vllm.releases`, on stand-ins shaped like the vLLM
releases that differ (the installed vLLM's real ones are run by the engine tier)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from smg_servicer_vllm import releases

pytestmark = pytest.mark.unit


class BudgetBefore027:
    """``MultiModalBudget`` before 0.27: two positional parameters."""

    def __init__(self, vllm_config: Any, mm_registry: Any, /) -> None:
        self.args = (vllm_config, mm_registry)


class Budget027:
    def __init__(self, vllm_config: Any, mm_registry: Any, *, enable_cache: bool = True) -> None:
        self.enable_cache = enable_cache


class Renderer019:
    async def process_for_engine_async(self, prompt: Any, arrival_time: float) -> Any:
        return prompt


class Renderer020:
    async def process_for_engine_async(
        self, prompt: Any, arrival_time: float, *, skip_mm_cache: bool = False
    ) -> Any:
        return skip_mm_cache


def forwards(*args: Any, **kwargs: Any) -> None:
    """Takes anything by ``**kwargs``: not proof that the keyword is understood."""


def test_a_keyword_is_passed_only_where_the_release_takes_it() -> None:
    assert releases.keywords(BudgetBefore027, enable_cache=False) == {}
    budget = BudgetBefore027(1, 2, **releases.keywords(BudgetBefore027, enable_cache=False))
    assert budget.args == (1, 2)
    assert releases.keywords(Budget027, enable_cache=False) == {"enable_cache": False}
    assert not Budget027(1, 2, **releases.keywords(Budget027, enable_cache=False)).enable_cache
    # bound methods are read through their function (and cached per function, not per object)
    assert releases.keywords(Renderer019().process_for_engine_async, skip_mm_cache=True) == {}
    new = Renderer020().process_for_engine_async
    assert releases.keywords(new, skip_mm_cache=True, tok_params=None) == {"skip_mm_cache": True}
    assert releases.keywords(forwards, skip_mm_cache=True) == {}
    assert releases.keywords(len, skip_mm_cache=True) == {}  # no keyword parameters


def _fake_vllm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *, launchers: bool) -> None:
    package = tmp_path / "vllm"
    (package / "entrypoints").mkdir(parents=True)
    (package / "entrypoints" / "grpc_server.py").write_text("")
    if launchers:
        (package / "entrypoints" / "launchers").mkdir()
        (package / "entrypoints" / "launchers" / "grpc_server.py").write_text("")
    spec = SimpleNamespace(submodule_search_locations=[str(package)])
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: spec if name == "vllm" else real(name, *a)
    )


@pytest.mark.parametrize(
    ("launchers", "module"),
    [(True, "vllm.entrypoints.launchers.grpc_server"), (False, "vllm.entrypoints.grpc_server")],
)
def test_the_launcher_module_is_the_one_the_installed_vllm_has(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, launchers: bool, module: str
) -> None:
    _fake_vllm(tmp_path, monkeypatch, launchers=launchers)
    assert releases.launcher_module() == module


def test_without_vllm_the_launcher_is_the_current_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    assert releases.launcher_module() == releases.LAUNCHER_MODULES[0]


def test_kv_event_sources_come_from_the_engine_only_when_it_can_report_them() -> None:
    cfg = SimpleNamespace(endpoint="tcp://*:5557")
    assert releases.kv_event_sources(SimpleNamespace()) == {}  # before 0.31: no method
    assert releases.kv_event_sources(SimpleNamespace(get_kv_event_sources=lambda: {"1": cfg})) == {
        1: cfg
    }

    def not_yet() -> dict[int, Any]:
        raise RuntimeError("engine not started")

    assert releases.kv_event_sources(SimpleNamespace(get_kv_event_sources=not_yet)) == {}


def test_the_launcher_is_decided_by_which_modules_the_release_has() -> None:
    current, old = releases.LAUNCHER_MODULES
    assert releases.launcher_for(lambda module: module in {current, old}) == current  # 0.30+
    assert releases.launcher_for(lambda module: module == old) == old  # 0.19-0.29


def test_multimodal_support_is_the_configurations_else_the_registrys() -> None:
    def never(config: Any) -> bool:
        raise AssertionError("the registry was asked")

    # 0.31+: the configuration's property (the registry lost its method)
    for supported in (True, False):
        config = SimpleNamespace(supports_multimodal_inputs=supported, is_multimodal_model=True)
        registry = SimpleNamespace(supports_multimodal_inputs=never)
        assert releases.supports_multimodal_inputs(config, registry) is supported
    # 0.19-0.30: the registry's method, asked about a multimodal model only
    for supported in (True, False):
        config = SimpleNamespace(is_multimodal_model=True)
        registry = SimpleNamespace(supports_multimodal_inputs=lambda c, s=supported: s)
        assert releases.supports_multimodal_inputs(config, registry) is supported
    text = SimpleNamespace(is_multimodal_model=False)
    assert not releases.supports_multimodal_inputs(
        text, SimpleNamespace(supports_multimodal_inputs=never)
    )
    assert not releases.supports_multimodal_inputs(SimpleNamespace(), SimpleNamespace())  # a fake


def test_the_launcher_stop_bound_covers_0_34s_drain() -> None:
    """0-s --shutdown-timeout (every release's default): the launcher's fixed 5 s grace; above 0,
    0.34 drains max(T, 5) s, then tears the engine down and flushes (5 + 5 s)."""
    assert releases.launcher_stop_s(0) == releases.LAUNCHER_GRACE_S == 5.0
    assert releases.launcher_stop_s(2) == 5.0 + 10.0
    assert releases.launcher_stop_s(60) == 60.0 + 10.0

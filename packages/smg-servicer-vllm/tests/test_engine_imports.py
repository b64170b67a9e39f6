"""Only ``_engine``, ``_mm_engine`` and ``_mm_layouts`` import vLLM or torch (read from the
sources with ``ast``: function-level imports count). Everything else reaches the engine through
them, so the request rules, the multimodal orchestration, the sidecar's settings and the worker's
sidecar client stay importable and testable without an engine (the facade's tests import them
and check that no engine was loaded)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import smg_servicer_vllm

pytestmark = pytest.mark.unit

SRC = Path(smg_servicer_vllm.__file__).parent
ENGINE = {"vllm", "torch"}
ENGINE_MODULES = ["_engine.py", "_mm_engine.py", "_mm_layouts.py"]


def engine_imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module.split(".")[0])
    return found & ENGINE


def test_only_the_engine_modules_import_vllm_or_torch() -> None:
    importing = sorted(
        str(path.relative_to(SRC)) for path in SRC.rglob("*.py") if engine_imports(path)
    )
    assert importing == ENGINE_MODULES


def test_the_orchestration_is_not_in_the_engine_module() -> None:
    classes = {
        node.name
        for node in ast.walk(ast.parse((SRC / "_mm_engine.py").read_text()))
        if isinstance(node, ast.ClassDef)
    }
    assert "MultimodalPath" not in classes
    from smg_servicer_vllm.multimodal import MultimodalPath

    assert MultimodalPath.__module__ == "smg_servicer_vllm.multimodal"

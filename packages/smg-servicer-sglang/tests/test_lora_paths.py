"""Where ``LoadLoRAAdapter`` may read (``lora.confine``), without an engine: every path it accepts
is an adapter folder inside the allowed folders, links followed; a drawn path that is not is
refused with a client code and a message that never shows where a link leads."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from smg_servicer_core.errors import (
    FailedPrecondition,
    InvalidRequest,
    NotFound,
    PermissionDenied,
    ServicerError,
)
from smg_servicer_core.testing.tiny_lora import CONFIG, WEIGHTS, TinyLoraSpec, make_tiny_lora
from smg_servicer_sglang import lora

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("paths")
    allowed, outside = root / "allowed", root / "secret-outside"
    make_tiny_lora(allowed / "ok", TinyLoraSpec(rank=2))
    make_tiny_lora(outside / "elsewhere", TinyLoraSpec(rank=2))
    (allowed / "nested" / "deeper").mkdir(parents=True)
    shutil.copytree(allowed / "ok", allowed / "nested" / "deeper" / "ok2")
    (allowed / "link-in").symlink_to(allowed / "ok")
    (allowed / "link-out").symlink_to(outside / "elsewhere")
    (allowed / "link-root").symlink_to("/")
    (allowed / "weights-out").mkdir()
    shutil.copy(allowed / "ok" / CONFIG, allowed / "weights-out" / CONFIG)
    (allowed / "weights-out" / WEIGHTS).symlink_to(outside / "elsewhere" / WEIGHTS)
    return {"allowed": allowed, "outside": outside}


def test_loads_are_off_until_the_operator_names_folders() -> None:
    with pytest.raises(FailedPrecondition, match="--lora-allowed-dirs"):
        lora.confine("/anything", ())


def test_an_adapter_inside_is_taken_by_its_real_path(tree: dict[str, Path]) -> None:
    roots = (tree["allowed"].resolve(),)
    assert lora.confine(str(tree["allowed"] / "ok"), roots) == (tree["allowed"] / "ok").resolve()
    assert (
        lora.confine(str(tree["allowed"] / "link-in"), roots) == (tree["allowed"] / "ok").resolve()
    )
    assert lora.adapter_rank(tree["allowed"] / "ok", "'ok'") == 2


@pytest.mark.parametrize(
    ("name", "error"),
    [
        ("link-out", PermissionDenied),
        ("link-root/etc", PermissionDenied),
        ("weights-out", PermissionDenied),
        ("nested", InvalidRequest),
        ("missing", NotFound),
        # The property test's find: a name too long for the file system (an OSError) was INTERNAL.
        pytest.param("x" * 300, InvalidRequest, id="long-name"),
    ],
)
def test_what_is_refused_and_how(tree: dict[str, Path], name: str, error: type) -> None:
    with pytest.raises(error) as err:
        lora.confine(str(tree["allowed"] / name), (tree["allowed"].resolve(),))
    assert "secret-outside" not in str(err.value)


def test_the_allowed_folders_setting_takes_absolute_existing_folders(tmp_path: Path) -> None:
    assert lora.parse_dirs(f"{tmp_path}{os.pathsep}") == (tmp_path.resolve(),)
    with pytest.raises(ValueError, match="absolute"):
        lora.parse_dirs("relative/dir")
    with pytest.raises(ValueError, match="not a folder"):
        lora.parse_dirs(str(tmp_path / "missing"))


_PARTS = st.sampled_from(
    ["ok", "link-in", "link-out", "link-root", "weights-out", "nested", "deeper", "ok2", "..",
     ".", "", "etc", "secret-outside", "elsewhere", "\x00", "x" * 300]
)  # fmt: skip


@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(parts=st.lists(_PARTS, max_size=6), absolute=st.booleans())
def test_any_accepted_path_is_an_adapter_inside_the_folders(
    tree: dict[str, Path], parts: list[str], absolute: bool
) -> None:
    root = tree["allowed"].resolve()
    raw = "/".join([str(tree["allowed"]) if absolute else "allowed", *parts])
    got: Path | None = None
    try:
        got = lora.confine(raw, (root,))
    except (InvalidRequest, NotFound, PermissionDenied) as err:
        refused = str(err)
    except ServicerError as err:  # pragma: no cover - any other code is a defect
        pytest.fail(f"{type(err).__name__} for {raw!r}")
    else:
        refused = None
    if refused is not None or got is None:
        assert refused is not None and ("secret-outside" not in refused or "secret-outside" in raw)
        return
    assert got == root or root in got.parents
    assert (got / CONFIG).is_file() and (got / WEIGHTS).is_file()
    assert root in (got / WEIGHTS).resolve().parents

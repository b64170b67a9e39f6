"""The router's direct ZMQ lane under test: one of our headless launchers on an ``ipc://`` worker
URL and the real router (``smg launch --backend ENGINE``) in front of it, plus the small waits and
readers the lane tests share (vLLM: test_vllm_zmq_lane.py, SGLang: test_sglang_zmq_lane.py,
TokenSpeed: packages/smg-servicer-tokenspeed/tests/engine/test_zmq_lane.py)."""

from __future__ import annotations

import json
import signal
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import psutil

from smg_it.figures import record
from smg_servicer_core.testing.process import WorkerProcess, start_worker
from smg_servicer_core.testing.router import Router


class Lane:
    """``command`` (a headless launcher aimed at ``url``) and the router in front of it; the
    router polls the worker's health and load every second."""

    def __init__(
        self,
        command: Sequence[str],
        backend: str,
        model: Path,
        url: str,
        *router_flags: str,
        env: dict[str, str] | None = None,
    ) -> None:
        self.model = str(model)
        self.url = url
        self.engine: WorkerProcess = start_worker(command, 0, "", env)
        self.router = Router(
            url,
            "--backend", backend,
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
        except BaseException as err:
            # The router's log says the worker never answered; the launcher's says why.
            err.add_note(f"the launcher's log (last lines):\n{self.engine.tail(6000)}")
            self.engine.stop(5)
            raise

    def body(self, **fields: object) -> dict[str, object]:
        return {"model": self.model, "temperature": 0, **fields}

    def post(self, path: str, **fields: object) -> httpx.Response:
        return httpx.post(self.router.base + path, json=self.body(**fields), timeout=60)

    def worker(self) -> dict:
        (worker,) = httpx.get(self.router.base + "/workers", timeout=10).json()["workers"]
        return worker

    def loads(self) -> list[dict]:
        return httpx.get(self.router.base + "/get_loads", timeout=10).json()["loads"]

    def stop(self) -> None:
        self.router.stop()
        self.engine.stop(60)


def engine_cores(lane: Lane) -> list[psutil.Process]:
    """vLLM's engine core processes under the lane's launcher."""
    return [p for p in lane.engine.children() if "EngineCore" in " ".join(p.cmdline())]


def events(response: httpx.Response) -> Iterator[dict]:
    """The JSON events of a streamed response (``data: [DONE]`` left out)."""
    for line in response.iter_lines():
        if line.startswith("data: ") and line != "data: [DONE]":
            yield json.loads(line[len("data: ") :])


def until(check: Callable[[], object], timeout_s: float, what: str | Callable[[], str]) -> float:
    """Poll ``check`` every 50 ms until it is true (``what`` fails the test after
    ``timeout_s``: a callable is asked then, to say what it saw); the seconds it took."""
    start = time.monotonic()
    while not check():
        assert time.monotonic() - start < timeout_s, what() if callable(what) else what
        time.sleep(0.05)
    return time.monotonic() - start


def check_stream_and_non_stream_agree(lane: Lane, path: str) -> None:
    """Chat or completions (``path``), streaming and not, greedy: the same text, finish and
    usage."""
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
    assert usage["total_tokens"] == usage["prompt_tokens"] + 12
    assert usage["prompt_tokens"] > 0
    text = choice["message"]["content"] if "message" in choice else choice["text"]
    assert text

    body = lane.body(
        max_tokens=12, ignore_eos=True, stream=True, stream_options={"include_usage": True}
    )
    with httpx.stream("POST", lane.router.base + path, json={**body, **prompt}, timeout=60) as s:
        assert s.status_code == 200
        streamed_events = list(events(s))
    pieces = [e["choices"][0] for e in streamed_events if e.get("choices")]
    streamed = "".join((c.get("delta") or {}).get("content") or c.get("text") or "" for c in pieces)
    assert streamed == text, "greedy: streaming and non-streaming give the same text"
    assert [c.get("finish_reason") for c in pieces if c.get("finish_reason")] == ["length"]
    assert [e["usage"]["completion_tokens"] for e in streamed_events if e.get("usage")] == [12]


def check_structured_output_and_logprobs(lane: Lane) -> None:
    """The router builds the grammar and the logprob request itself; the engine honours them."""
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


def check_the_router_sees_the_load(lane: Lane, long: int) -> None:
    """The engine's load reaches the router (``/get_loads``, polled every second here): requests
    running while clients stream, none once those clients have left (the router aborts their
    requests: no wait for ``long`` tokens at the engine's CPU pace, ~50 s on SGLang's) and a
    short request has then run to its end (a finished request leaves the load too)."""
    body = lane.body(prompt="Tell me a long story", max_tokens=long, ignore_eos=True, stream=True)
    seen: list[int] = []
    leave = threading.Event()

    def watch() -> bool:
        seen.extend(load["num_running_reqs"] for load in lane.loads())
        return any(seen)

    def stream() -> int:
        """Read the stream until told to leave; the chunks read (the stream must not end
        first: ``long`` outlasts the wait)."""
        chunks = 0
        url = lane.router.base + "/v1/completions"
        with httpx.stream("POST", url, json=body, timeout=60) as s:
            assert s.status_code == 200
            for line in s.iter_lines():
                chunks += line.startswith("data: {")
                if leave.is_set() or line.startswith("data: [DONE]"):
                    break
        assert leave.is_set(), "a stream ended before the router saw the load"
        return chunks

    with ThreadPoolExecutor(4) as pool:
        clients = [pool.submit(stream) for _ in range(4)]
        try:
            until(watch, 30, lambda: f"the router never saw a running request: {seen[-20:]}")
        finally:
            leave.set()
        assert all(c.result() > 0 for c in clients)
    finished = lane.post("/v1/completions", prompt="Hello", max_tokens=8, ignore_eos=True)
    assert finished.status_code == 200, finished.text
    assert finished.json()["choices"][0]["finish_reason"] == "length", finished.text
    until(
        lambda: all(load["num_running_reqs"] == 0 for load in lane.loads()),
        10,
        lambda: f"the load stayed up after the clients left and a request finished: {lane.loads()}",
    )


def check_a_disconnect_aborts(lane: Lane, long: int) -> str:
    """A client that goes away after a few chunks: the router sends the engine an abort for its
    request (the launcher's engine logs it), long before the request could have run to its
    length, and the engine serves the next request. The request id."""
    body = lane.body(prompt="Tell me a long story", max_tokens=long, ignore_eos=True, stream=True)
    with httpx.stream("POST", lane.router.base + "/v1/completions", json=body, timeout=60) as s:
        assert s.status_code == 200
        stream = events(s)
        rid = next(stream)["id"]
        for _ in range(3):
            next(stream)
    until(
        lambda: f"the router aborts {rid}" in lane.engine.tail(100_000),
        10,
        f"the engine was never told that the client of {rid} left",
    )
    served = lane.post("/v1/completions", prompt="Hello", max_tokens=4)
    assert served.status_code == 200, served.text
    return rid


def check_the_server_aborts_for_a_client_that_left(lane: Lane, long: int, engine: str) -> None:
    """A Rust-lane worker (``grpc://``): a client that goes away after a few chunks has its
    request aborted in the engine (the engine side logs "the router aborts <id>" with this
    request's id, which the router's stream carries as its ``id``), and the next request is
    served."""
    body = lane.body(prompt="Tell me a long story", max_tokens=long, ignore_eos=True, stream=True)
    rid = ""
    with httpx.stream("POST", lane.router.base + "/v1/completions", json=body, timeout=60) as s:
        assert s.status_code == 200
        for _, line in zip(range(4), s.iter_lines(), strict=False):
            if not rid and line.startswith("data: {"):
                rid = json.loads(line[len("data: ") :])["id"]
    assert rid, "the stream carried no request id"
    until(
        lambda: f"the router aborts {rid}" in lane.engine.tail(100_000),
        10,
        f"the {engine} was never told that the client of {rid} left",
    )
    assert lane.post("/v1/completions", prompt="Hello", max_tokens=4).status_code == 200


def errored(response: httpx.Response) -> bool:
    """An answer that is an error (what a refused request gets on the vLLM and SGLang lanes)."""
    return response.status_code != 200


def aborted(response: httpx.Response) -> bool:
    """Refused on a TokenSpeed lane: an error, or a request that ended at once by abort with no
    token (TokenSpeed's output wire carries the finish type, not a status)."""
    if response.status_code != 200:
        return True
    choice = response.json()["choices"][0]
    return choice["finish_reason"] == "abort" and not choice["text"]


#: The drain (seconds) a lane under :func:`sigterm_mid_stream` is given instead of the launchers'
#: 30 s default: the stream it drains must finish inside it, and on a loaded 2-core machine a
#: 600-900-token stream at a CPU engine's pace can take longer than 30 s.
TEST_DRAIN_S = 300


#: The streams in flight when :func:`sigterm_mid_stream` sends SIGTERM: a drain under load.
UNDER_LOAD = 3


def sigterm_mid_stream(
    lane: Lane, long: int, figures: str, refused: Callable[[httpx.Response], bool] = errored
) -> tuple[list[str], list[httpx.Response]]:
    """Stream :data:`UNDER_LOAD` ``long`` completions; once each has its first chunks SIGTERM
    the launcher and post short requests until one is ``refused`` (for up to 10 s). The streams'
    finish reasons and the posts' answers, in order. The launcher's exit (its code, and seconds
    after the signal) and what every stream got are recorded as ``figures``'s drain figures
    (:mod:`smg_it.figures`). The lane's drain should be :data:`TEST_DRAIN_S`."""
    body = lane.body(prompt="Tell me a long story", max_tokens=long, ignore_eos=True, stream=True)
    started = threading.Barrier(UNDER_LOAD + 1, timeout=60)
    got: list[list[dict]] = [[] for _ in range(UNDER_LOAD)]

    def stream(index: int) -> None:
        url = lane.router.base + "/v1/completions"
        try:
            with httpx.stream("POST", url, json=body, timeout=120) as s:
                assert s.status_code == 200
                chunks = events(s)
                got[index] += [next(chunks) for _ in range(5)]
                started.wait()
                got[index] += list(chunks)
        except BaseException:
            started.abort()  # the others stop waiting; this error is the one to show
            raise

    answers: list[httpx.Response] = []
    with ThreadPoolExecutor(UNDER_LOAD) as pool:
        streams = [pool.submit(stream, i) for i in range(UNDER_LOAD)]
        try:
            started.wait()
        except threading.BrokenBarrierError:
            for one in streams:
                if not isinstance(one.exception(), threading.BrokenBarrierError):
                    one.result()
            raise
        signalled = time.monotonic()
        lane.engine.proc.send_signal(signal.SIGTERM)
        deadline = signalled + 10
        while time.monotonic() < deadline and (not answers or not refused(answers[-1])):
            answers.append(lane.post("/v1/completions", prompt="Hello", max_tokens=4))
        for done in streams:
            done.result()
    code = lane.engine.proc.wait(120)
    finishes = [
        c["finish_reason"]
        for events_of_one in got
        for c in (e["choices"][0] for e in events_of_one if e.get("choices"))
        if c.get("finish_reason")
    ]
    silent = sum(not any(_ended(e) for e in one) for one in got)
    record(
        figures,
        drain_streams=UNDER_LOAD,
        drain_finished=finishes.count("length"),
        drain_silent=silent,
        drain_new_call=str(answers[-1].status_code) if answers else "-",
        drain_exit=code,
        drain_exit_s=round(time.monotonic() - signalled, 1),
    )
    return finishes, answers


def _ended(event: dict) -> bool:
    """A finish or an error: what keeps a stream that stops from being a silent truncation."""
    choices = event.get("choices") or [{}]
    return bool(choices[0].get("finish_reason") or event.get("error"))


def kill_mid_stream(lane: Lane, victim: psutil.Process, long: int, figures: str) -> list[str]:
    """Stream a ``long`` completion in the background and SIGKILL ``victim`` (an engine process)
    after its first chunks; then the stream must end within 5 s and the launcher exit 1 with
    nothing left running, the next request fail, and the router take the worker out. The
    stream's lines; ``figures``'s death figures recorded (:mod:`smg_it.figures`)."""
    body = lane.body(prompt="Tell me a story", max_tokens=long, ignore_eos=True, stream=True)
    ended = threading.Event()
    lines: list[str] = []

    def read() -> None:
        url = lane.router.base + "/v1/completions"
        with httpx.stream("POST", url, json=body, timeout=60) as s:
            for line in s.iter_lines():
                lines.append(line)
        ended.set()

    threading.Thread(target=read, daemon=True).start()
    until(lambda: len(lines) >= 5, 30, "the stream never started")
    everything = lane.engine.children()
    killed = time.monotonic()
    victim.kill()
    assert ended.wait(5), "the stream did not end after the engine died"
    detected = time.monotonic() - killed
    assert '"finish_reason":"length"' not in "".join(lines), "a killed engine cannot finish it"
    code = lane.engine.proc.wait(30)
    refused = lane.post("/v1/completions", prompt="Hello", max_tokens=4)
    until(lambda: not lane.worker()["is_healthy"], 5, "the router kept the dead worker healthy")
    out_s = time.monotonic() - killed
    _, alive = psutil.wait_procs(everything, timeout=10)
    record(
        figures,
        death_detection_s=round(detected, 3),
        death_codes=[str(refused.status_code)],
        # The lane's router probes every second and takes a worker out at the first failure
        # (what docs/lanes.md recommends).
        death_health=f"out of rotation after {out_s:.1f} s",
        death_exit=code,
        death_left=len(alive),
    )
    assert code == 1, lane.engine.tail()
    assert refused.status_code >= 500, refused.text
    assert not alive, f"left running: {alive}"
    return lines

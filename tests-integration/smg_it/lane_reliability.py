"""The reliability suite on the fast lanes (issue #41): the Rust lane (smg's Rust servicer in our
launcher, ``grpc://``) and the router's direct ZMQ lane (``ipc://``) of each engine, attacked the
way a user's traffic reaches them: through the real router, over HTTP (the ZMQ lane has no gRPC
server to call directly). The Python lanes' suite (``tests-integration/reliability/``) calls the
servicer over gRPC; the checks here are its checks in the router's terms:

- **fuzz**: requests drawn at and beyond every bound the router lets through (token ids outside
  the vocabulary, empty and context-filling prompts, absurd sampling values, streaming or not, on
  the completions, chat and ``/generate`` routes). Each answer is served (a finish on every
  choice), a client fault (4xx), or an answer the lane conformance table documents for this lane
  (``smg_it.conformance.TABLE``: e.g. vLLM's fast lanes answer our guard's refusal 500, because
  smg maps every engine-side request error so). Anything else is a failure: an undocumented 5xx,
  an error event inside a stream, a stream that stops without a finish.
- **cancel storm**: requests whose clients leave at a random point (after 0-6 events, or at a
  deadline of 1-500 ms); afterwards the engine holds no request (its own counts, as the router
  reads them from ``/get_loads``), its log has no new traceback, and it answers the reference
  request as before. Many storm requests ask for 900 tokens: one that was not aborted would still
  be running when the load is read.
- **slow reader**: one client reads a long stream slowly while others stream at full speed;
  everyone gets every token and a finish.
- **SIGTERM under load** and **engine death**: :func:`smg_it.zmq_lane.sigterm_mid_stream` and
  :func:`~smg_it.zmq_lane.kill_mid_stream`, which record their figures through :func:`record`.

Each check records the same figures the Python lanes' suite does, under ``"<engine> <lane>"``
(``tools/reliability_report.py`` prints them as columns beside the engines')."""

from __future__ import annotations

import json
import os
import random
import re
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import psutil

from smg_it import figures
from smg_it.conformance import TABLE, Answer
from smg_it.zmq_lane import Lane, events

FUZZ_CASES = int(os.environ.get("SMG_LANE_FUZZ_CASES", "48"))
STORM_REQUESTS = int(os.environ.get("SMG_LANE_STORM_REQUESTS", "160"))
STORM_CONCURRENCY = 16
SEED = int(os.environ.get("SMG_FUZZ_SEED", "20261202"))
#: How long a storm's requests may take to leave the engine once their clients have gone (the
#: router's abort reaches the engine in well under a second; the load it reads is a second old).
#: Shorter than a 900-token request takes at a CPU engine's pace here (the lane tests' ``LONG``
#: outlasts their 10 s waits), so a request the router did not abort is still held.
SETTLE_S = 10.0
TRACEBACK = re.compile(r"^Traceback \(most recent call last\)", re.MULTILINE)
WORDS = ("the", "a", "story", "of", "Hello", "there", "cat", "sat", "on", "mat", "é", "\n", "42")
#: The tiny model every lane serves (the conformance table's answers name the same limits).
VOCAB = 4096
CONTEXT = 1024
#: The reference request every check ends with: greedy, eight tokens, the same prompt.
REFERENCE = {"prompt": "Hello there", "max_tokens": 8, "ignore_eos": True}


def key(lane: str, engine: str) -> str:
    """The figures file's entry of ``engine``'s ``lane`` (``"vllm zmq"``)."""
    return f"{engine} {lane}"


def record(lane: str, engine: str, **values: Any) -> None:
    figures.record(key(lane, engine), **values)


def reference(lane: Lane) -> str:
    answer = lane.post("/v1/completions", **REFERENCE)
    assert answer.status_code == 200, answer.text
    return answer.json()["choices"][0]["text"]


def documented(lane: str, engine: str) -> list[Answer]:
    """The answers the conformance table gives bad input on this lane: what fuzzed input may get
    beside a 4xx and a served request."""
    return list(TABLE[lane, engine].values())


def judge(status: int, text: str, allowed: list[Answer], streamed: bool) -> str | None:
    """What is wrong with an answer (None: nothing). ``text`` is the body (a stream's lines)."""
    said = any(a.status == status and a.says.lower() in text.lower() for a in allowed)
    if 400 <= status < 500 or said:
        return None
    if status != 200:
        return f"{status}: {text[:160]!r}"
    return _stream_fault(text, allowed) if streamed else _answer_fault(text)


def _stream_fault(text: str, allowed: list[Answer]) -> str | None:
    """A stream's fault: an error event (unless it carries a refusal the table documents: the
    router has sent its 200 before the engine refused, so a refused stream ends so), or no
    finish."""
    lines = [line for line in text.splitlines() if line.startswith("data: {")]
    refusals = [a.says.lower() for a in allowed]
    for line in lines:
        if line.startswith('data: {"error"') and not any(r in line.lower() for r in refusals):
            return f"an error inside a stream: {line[:160]!r}"
    if any(line.startswith('data: {"error"') for line in lines):
        return None
    if not any('"finish_reason":"' in line for line in lines):
        return f"a stream without a finish: {text[-160:]!r}"
    return None


def _answer_fault(text: str) -> str | None:
    body = json.loads(text)
    choices = body.get("choices") if isinstance(body, dict) else None
    if choices is not None and not all(c.get("finish_reason") for c in choices):
        return f"an answer without a finish: {text[:160]!r}"
    return None


#: Each sampling field's values: (within its bounds, at or beyond them).
POOLS: dict[str, tuple[tuple[Any, ...], tuple[Any, ...]]] = {
    "temperature": ((0, 0.5, 1.0, 2.0), (-1, 1e30)),
    "top_p": ((0.1, 0.9, 1.0), (0, 1.5, -0.5)),
    "top_k": ((-1, 1, 5), (0, 10**9)),
    "min_p": ((0, 0.5), (1.0, 2.0)),
    "frequency_penalty": ((0, 1.5), (-3, 3)),
    "presence_penalty": ((0, 1.0), (-3, 2.5)),
    "repetition_penalty": ((1.0, 1.3), (0, -1)),
    "seed": ((0, 7), (2**31, -1)),
    "ignore_eos": ((True, False), ()),
    "min_tokens": ((0, 2), (4, 10**6)),
    "stop": (("\n", ["a", "the"]), ("", "x" * 300)),
}


def _sampling(rng: random.Random, tame: bool) -> dict[str, Any]:
    """Some sampling fields: a ``tame`` request's within bounds (so that it reaches the engine),
    another's from both pools."""
    drawn: dict[str, Any] = {}
    for name, (inside, beyond) in POOLS.items():
        if rng.random() < 0.35:
            drawn[name] = rng.choice(inside if tame or not beyond else inside + beyond)
    return drawn


def fuzz_case(rng: random.Random, vocab: int, context: int) -> tuple[str, dict[str, Any]]:
    """One request (route, body without the model): half of them tame (every value within
    bounds, so the engine serves it), half at and beyond every bound."""
    tame = rng.random() < 0.5
    inside = [rng.randrange(vocab) for _ in range(rng.randint(1, 24))]
    edges = ([], [5, 6, vocab], [vocab - 1, 5], [2**31], [5] * (context - 1), [5] * context)
    ids = inside if tame else rng.choice((inside, *edges))
    texts = ("Hello", "é" * 30, "Tell me a story")
    text = rng.choice(texts if tame else (*texts, "", " ", "\x00", "é" * 300, "x" * 3000))
    lengths = (1, 4, 16, 64)
    max_tokens = rng.choice(lengths if tame else (*lengths, 0, context, context + 1, 2**31 - 1, -1))
    stream = rng.random() < 0.5
    route = rng.choice(("/v1/completions", "/v1/chat/completions", "/generate"))
    if route == "/generate":
        sampling = {"max_new_tokens": max_tokens, **_sampling(rng, tame)}
        sampling.pop("seed", None)
        prompt: dict[str, Any] = {"input_ids": ids} if rng.random() < 0.7 else {"text": text}
        return route, {**prompt, "sampling_params": sampling}
    extras = _sampling(rng, tame)
    if rng.random() < 0.2:
        extras["logprobs"] = True if route.endswith("chat/completions") else rng.choice((0, 3))
    if rng.random() < 0.15:
        schemas = ({"type": "string", "enum": ["yes", "no"]}, {"type": "nonsense"})
        named = {"name": "s", "schema": schemas[0] if tame else rng.choice(schemas)}
        extras["response_format"] = {"type": "json_schema", "json_schema": named}
    if route == "/v1/chat/completions":
        prompt = {"messages": [{"role": "user", "content": text}]}
    else:
        prompt = {"prompt": text}
    return route, {**prompt, "max_tokens": max_tokens, "stream": stream, **extras}


#: How long a fuzzed request may go unanswered (the longest one the router lets through asks
#: for 1,023 tokens: seconds at a CPU engine's pace).
FUZZ_ANSWER_S = 60.0


def _send(lane: Lane, route: str, body: dict[str, Any]) -> tuple[int, str, bool]:
    """The status, the body (a stream's lines) and whether it streamed; a request left
    unanswered for :data:`FUZZ_ANSWER_S` is status 0."""
    url = lane.router.base + route
    full = {"model": lane.model, **body}
    streamed = bool(body.get("stream"))
    try:
        with httpx.stream("POST", url, json=full, timeout=FUZZ_ANSWER_S) as response:
            text = "\n".join(response.iter_lines()) if streamed else response.read().decode()
            return response.status_code, text, streamed and response.status_code == 200
    except httpx.TimeoutException:
        return 0, f"no answer within {FUZZ_ANSWER_S} s", False


def check_fuzz(lane: Lane, lane_name: str, engine: str, vocab: int, context: int) -> None:
    """:data:`FUZZ_CASES` fuzzed requests, four at a time; every answer judged; the engine
    serves the reference request as before."""
    before = reference(lane)
    rng = random.Random(SEED)
    cases = [fuzz_case(rng, vocab, context) for _ in range(FUZZ_CASES)]
    allowed = documented(lane_name, engine)
    codes: Counter[str] = Counter()
    failures: list[str] = []
    with ThreadPoolExecutor(4) as pool:
        for (route, body), (status, text, streamed) in zip(
            cases, pool.map(lambda case: _send(lane, *case), cases), strict=True
        ):
            codes[f"HTTP {status}"] += 1
            wrong = judge(status, text, allowed, streamed)
            if wrong:
                failures.append(f"{route} {json.dumps(body)[:200]}: {wrong}")
    assert lane.engine.proc.poll() is None, lane.engine.tail()
    after = reference(lane)
    tally = {"fuzz_cases": len(cases), "fuzz_codes": dict(codes), "fuzz_failures": len(failures)}
    record(lane_name, engine, **tally)
    assert not failures, "\n".join(failures[:10])
    assert after == before, f"the reference answer changed after the fuzz: {before!r} -> {after!r}"


def tree_rss(lane: Lane) -> int:
    """The launcher's whole process tree's resident memory (bytes)."""
    root = psutil.Process(lane.engine.proc.pid)
    total = 0
    for proc in (root, *root.children(recursive=True)):
        try:
            total += proc.memory_info().rss
        except psutil.NoSuchProcess:
            continue
    return total


def engine_holds(lane: Lane) -> int:
    """The requests the engine holds (running and waiting, every rank), as the router reads
    them."""
    return sum(
        int(load.get("num_running_reqs", 0)) + int(load.get("num_waiting_reqs", 0))
        for load in lane.loads()
    )


def _storm_one(lane: Lane, index: int) -> str:
    """One storm request; how it ended: ``left`` (the client went away), ``finished``, or what
    went wrong."""
    rng = random.Random(SEED * 7919 + index)
    stream = rng.random() < 0.8
    deadline = rng.random() < 0.3
    after = rng.randint(0, 6)
    body = {
        "model": lane.model,
        "prompt": " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 24))),
        "max_tokens": rng.choice((8, 64, 900, 900)),
        "ignore_eos": True,
        "stream": stream,
        "temperature": rng.choice((0, 0.8)),
    }
    timeout = httpx.Timeout(60, read=rng.uniform(0.001, 0.5)) if deadline or not stream else 60
    url = lane.router.base + "/v1/completions"
    lines: list[str] = []
    try:
        with httpx.stream("POST", url, json=body, timeout=timeout) as response:
            if response.status_code != 200:
                return f"{response.status_code}: {response.read()[:160]!r}"
            if not stream:
                text = response.read().decode()
                return judge(200, text, [], False) or "finished"
            for line in response.iter_lines():
                lines.append(line)
                if not deadline and sum(x.startswith("data: {") for x in lines) >= after:
                    return "left"
    except httpx.TimeoutException:
        return "left"
    return judge(200, "\n".join(lines), [], True) or "finished"


def check_storm(lane: Lane, lane_name: str, engine: str) -> None:
    """:data:`STORM_REQUESTS` requests, :data:`STORM_CONCURRENCY` at a time, each left by its
    client at a random point; then nothing held, no traceback, the same reference answer."""
    before = reference(lane)
    log_before = len(TRACEBACK.findall(lane.engine.tail(10**7)))
    rss_before = tree_rss(lane)
    with ThreadPoolExecutor(STORM_CONCURRENCY) as pool:
        endings = Counter(pool.map(lambda i: _storm_one(lane, i), range(STORM_REQUESTS)))
    settle = time.monotonic() + SETTLE_S
    while (leaked := engine_holds(lane)) and time.monotonic() < settle:
        time.sleep(0.2)
    tracebacks = len(TRACEBACK.findall(lane.engine.tail(10**7))) - log_before
    after = reference(lane)
    bad = {k: n for k, n in endings.items() if k not in ("left", "finished")}
    record(
        lane_name,
        engine,
        storm_requests=STORM_REQUESTS,
        storm_leaked=leaked,
        storm_bad_endings=sum(bad.values()),
        storm_rss_ratio=round(tree_rss(lane) / rss_before, 3),
        storm_tracebacks=tracebacks,
    )
    assert not bad, f"requests ended badly: {bad}"
    assert endings["left"] > STORM_REQUESTS // 2, endings
    assert leaked == 0, f"the engine still holds {leaked} requests {SETTLE_S} s after the storm"
    assert tracebacks == 0, lane.engine.tail()
    assert after == before, f"the reference answer changed after the storm: {before!r} -> {after!r}"


def _stream_gaps(lane: Lane, tokens: int, pause_s: float = 0.0) -> tuple[list[float], int, str]:
    """One streamed completion of ``tokens`` tokens read with ``pause_s`` between events: the
    gaps between its events (s), the tokens it got (its usage), its finish."""
    body = lane.body(
        prompt="Tell me a story",
        max_tokens=tokens,
        ignore_eos=True,
        stream=True,
        stream_options={"include_usage": True},
    )
    gaps: list[float] = []
    finish = ""
    got = 0
    with httpx.stream("POST", lane.router.base + "/v1/completions", json=body, timeout=120) as s:
        assert s.status_code == 200, s.read()
        last = time.monotonic()
        for event in events(s):
            now = time.monotonic()
            gaps.append(now - last)
            last = now
            finish = (event.get("choices") or [{}])[0].get("finish_reason") or finish
            got = (event.get("usage") or {}).get("completion_tokens", got)
            if pause_s:
                time.sleep(pause_s)
    return gaps, got, finish


def _others(lane: Lane, streams: int = 4, tokens: int = 64) -> tuple[float, float]:
    """``streams`` streams at full speed: their tokens a second and inter-event p99 (ms)."""
    start = time.monotonic()
    with ThreadPoolExecutor(streams) as pool:
        runs = list(pool.map(lambda _: _stream_gaps(lane, tokens), range(streams)))
    took = time.monotonic() - start
    assert all(r[1:] == (tokens, "length") for r in runs), [r[1:] for r in runs]
    gaps = sorted(g for run in runs for g in run[0][1:])
    p99 = gaps[min(len(gaps) - 1, int(len(gaps) * 0.99))] * 1000
    return streams * tokens / took, p99


def check_slow_reader(lane: Lane, lane_name: str, engine: str, tokens: int = 128) -> None:
    """A stream read at one event per 50 ms while four others stream at full speed: the slow
    reader gets every token and its finish, the others theirs; the figures compare the others
    with and without it (a benchmark's to judge, not this check's)."""
    base_rate, base_p99 = _others(lane)
    rss_before = tree_rss(lane)
    slow: dict[str, Any] = {}

    def read_slowly() -> None:
        slow["gaps"], slow["tokens"], slow["finish"] = _stream_gaps(lane, tokens, pause_s=0.05)

    reader = threading.Thread(target=read_slowly, daemon=True)
    reader.start()
    rate, p99 = _others(lane)
    reader.join(120)
    assert not reader.is_alive(), "the slow reader never finished"
    record(
        lane_name,
        engine,
        slow_throughput_ratio=round(rate / base_rate, 3),
        slow_itl_p99_ratio=round(p99 / base_p99, 3) if base_p99 else 1.0,
        slow_base_itl_p99_ms=round(base_p99, 1),
        slow_itl_p99_ms=round(p99, 1),
        slow_rss_growth_mb=round((tree_rss(lane) - rss_before) / 2**20, 1),
        slow_rounds=1,
    )
    assert slow["finish"] == "length", slow
    assert slow["tokens"] == tokens, f"the slow reader got {slow['tokens']} of {tokens} tokens"


def check_reliability(lane: Lane, lane_name: str, engine: str) -> None:
    """The fuzz, the cancel storm and the slow reader on one lane."""
    check_fuzz(lane, lane_name, engine, VOCAB, CONTEXT)
    check_storm(lane, lane_name, engine)
    check_slow_reader(lane, lane_name, engine)

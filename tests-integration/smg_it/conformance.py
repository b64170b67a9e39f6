"""The lane conformance table (issue #41): each input an engine cannot take, sent through the real
router on each lane of each engine, and the answer a client gets.

:data:`TABLE` is what every lane's test checks (:func:`mismatches`, through the lane's own router)
and what the README's lane table says (:func:`readme_row`, checked by
``tests-integration/test_conformance_table.py``). ``by`` names who decides the answer: ``ours``
(our servicer, or the guard we put inside the engine where no Python front end sees the
request) or ``smg`` (the router, or smg's Rust servicer, refuses the request itself, or maps what
our guard did to a status of its own choosing). Where smg decides, only smg can change it: a vLLM
request our guard refuses on the fast lanes is a 500, a TokenSpeed one a 200 ended by abort.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import httpx

from smg_it.zmq_lane import Lane

#: The cases: (path, body) on the router, beside the model and greedy sampling.
CASES: dict[str, tuple[str, dict[str, object]]] = {
    "too-long": ("/v1/completions", {"prompt": "Hello " * 1100, "max_tokens": 4}),
    "unknown-token": (
        "/generate",
        {"input_ids": [5, 6, 10**6], "sampling_params": {"max_new_tokens": 4}},
    ),
    "empty": ("/generate", {"input_ids": [], "sampling_params": {"max_new_tokens": 4}}),
    # The prompt rule of every lane: a prompt of the whole context leaves no room for one token.
    "fills-context": (
        "/generate",
        {"input_ids": [5] * 1024, "sampling_params": {"max_new_tokens": 4}},
    ),
    "bad-sampling": ("/v1/completions", {"prompt": "Hello", "max_tokens": 4, "temperature": -1}),
}

LANES = ("python", "rust", "zmq")
ENGINES = ("vllm", "sglang", "tokenspeed")


@dataclass(frozen=True)
class Answer:
    """A status and a fragment of the body (case-insensitive); ``abort``: a 200 whose request
    ended by abort with no token (TokenSpeed's ZMQ wire carries a finish type, not a status)."""

    status: int
    says: str
    by: str = "ours"

    def matches(self, response: httpx.Response) -> bool:
        return response.status_code == self.status and self.says.lower() in response.text.lower()


# Ours: our servicer's INVALID_ARGUMENT (the router's 400 carries our words), or on the ZMQ lane
# the guard we put inside the engine.
CONTEXT = Answer(400, "the context holds 1024")
VOCAB = Answer(400, "is outside the vocabulary (size 4096)")
EMPTY = Answer(400, "the prompt is empty")
# smg's: the router refuses before any worker sees the request (it knows the context of a gRPC
# worker from GetModelInfo, not of a ZMQ one), or smg's Rust servicer does.
SMG_CONTEXT = Answer(400, "maximum context length is 1024 tokens", by="smg")
SMG_SAMPLING = Answer(400, "temperature: Validation error", by="smg")
SMG_EMPTY = Answer(400, "tokenized.input_ids is required", by="smg")
# Refused by our guard inside the engine; the status is smg's mapping of what the engine's wire
# carries: vLLM's request error is a 500 "engine finished the request with an error";
# TokenSpeed's wire carries a finish type, not a status: a 200 ended by abort, no token.
VLLM_CORE_ERROR = Answer(500, "engine finished the request with an error", by="smg")
ABORT = Answer(200, '"finish_reason":"abort"', by="smg")

PYTHON = {
    "too-long": SMG_CONTEXT,
    "unknown-token": VOCAB,
    "empty": EMPTY,
    "fills-context": CONTEXT,
    "bad-sampling": SMG_SAMPLING,
}
TABLE: dict[tuple[str, str], dict[str, Answer]] = {
    ("python", "vllm"): PYTHON,
    ("python", "sglang"): PYTHON,
    ("python", "tokenspeed"): PYTHON,
    ("rust", "vllm"): {
        "too-long": SMG_CONTEXT, "unknown-token": VLLM_CORE_ERROR, "empty": VLLM_CORE_ERROR,
        "fills-context": VLLM_CORE_ERROR, "bad-sampling": SMG_SAMPLING,
    },
    ("rust", "sglang"): {
        "too-long": SMG_CONTEXT, "unknown-token": VOCAB, "empty": SMG_EMPTY,
        "fills-context": CONTEXT, "bad-sampling": SMG_SAMPLING,
    },
    ("rust", "tokenspeed"): {
        "too-long": SMG_CONTEXT, "unknown-token": ABORT, "empty": SMG_EMPTY,
        "fills-context": ABORT, "bad-sampling": SMG_SAMPLING,
    },
    ("zmq", "vllm"): {
        "too-long": VLLM_CORE_ERROR, "unknown-token": VLLM_CORE_ERROR, "empty": VLLM_CORE_ERROR,
        "fills-context": VLLM_CORE_ERROR, "bad-sampling": SMG_SAMPLING,
    },
    ("zmq", "sglang"): {
        "too-long": CONTEXT, "unknown-token": VOCAB, "empty": EMPTY, "fills-context": CONTEXT,
        "bad-sampling": SMG_SAMPLING,
    },
    ("zmq", "tokenspeed"): {
        "too-long": ABORT, "unknown-token": ABORT, "empty": ABORT, "fills-context": ABORT,
        "bad-sampling": SMG_SAMPLING,
    },
}  # fmt: skip


def mismatches(
    lane: str, engine: str, post: Callable[..., httpx.Response], served: Callable[[], bool]
) -> list[str]:
    """Each case whose answer through ``post(path, **body)`` (the lane's router) is not the
    table's, as ``case: got STATUS BODY, the table says ...``; after every case the engine must
    still serve (``served()``)."""
    found: list[str] = []
    for case, (path, body) in CASES.items():
        want = TABLE[lane, engine][case]
        got = post(path, **body)
        if not want.matches(got):
            found.append(f"{case}: got {got.status_code} {got.text[:200]!r}, the table says {want}")
        if not served():
            found.append(f"{case}: the engine no longer serves")
    return found


NAMES = {"vllm": "vLLM", "sglang": "SGLang", "tokenspeed": "TokenSpeed"}


def _said(answer: Answer) -> str:
    if answer is ABORT:
        return "200 ended by abort"
    return f"{answer.status} by smg" if answer.by == "smg" else f"{answer.status} by us"


def _summary(lane: str, engine: str) -> str:
    """One engine's answers on ``lane``: each status once, with its cases (every case: none)."""
    by_said: dict[str, list[str]] = {}
    for case, answer in TABLE[lane, engine].items():
        by_said.setdefault(_said(answer), []).append(case)
    if len(by_said) == 1:
        return f"{next(iter(by_said))} for each"
    return "; ".join(f"{said} for {', '.join(cases)}" for said, cases in by_said.items())


def _cell(lane: str) -> str:
    """What the README says for ``lane``: the engines with the same answers together."""
    engines: dict[str, list[str]] = {}
    for engine in ENGINES:
        engines.setdefault(_summary(lane, engine), []).append(NAMES[engine])
    return "<br>".join(f"{', '.join(names)}: {summary}" for summary, names in engines.items())


def readme_row() -> str:
    """The README lane table's row for bad input, generated from :data:`TABLE`."""
    cells = " | ".join(_cell(lane) for lane in LANES)
    cases = ", ".join(CASES)
    head = f"input the engine cannot take ({cases}; the engine serves on after each)"
    return f"| {head} | {cells} |"


def check_lane(lane_name: str, engine: str, lane: Lane) -> None:
    """:func:`mismatches` through a fast lane's router, and the engine process still running
    after every case."""

    def served() -> bool:
        ok = lane.post("/v1/completions", prompt="Hello", max_tokens=4).status_code == 200
        return ok and lane.engine.proc.poll() is None

    assert mismatches(lane_name, engine, lane.post, served) == []

"""Metrics checks shared by every engine's tests: scrape ``/metrics`` and a known workload.

    workload = await metrics_workload(stub, "vllm", prompt=[1, 2, 3])
    assert_workload_counted(scrape(port), workload)

The workload is the same on every wire: two streamed and one unary request of four tokens
(``ignore_eos``), one request refused (an empty prompt), and one stream stopped by the ``Abort``
RPC after its first message. The client counts what it received; the servicer's counters must
match those counts exactly.
"""

from __future__ import annotations

import asyncio
import ssl
import urllib.request
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
from prometheus_client.parser import text_string_to_metric_families

from smg_servicer_core.testing.requests import WIRES, Wire, generate_request, next_request_id

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def _families(port: int, host: str) -> list[Any]:
    with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=10) as response:
        return list(text_string_to_metric_families(response.read().decode()))


def scrape(port: int, host: str = "127.0.0.1") -> Samples:
    """Every sample of ``http://host:port/metrics``, keyed by (name, labels)."""
    samples: Samples = {}
    for family in _families(port, host):
        for sample in family.samples:
            samples[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return samples


def value(samples: Samples, name: str, **labels: str) -> float:
    """One sample's value (0 when absent)."""
    return samples.get((name, frozenset(labels.items())), 0.0)


def engine_gauge(samples: Samples, name: str, dp_rank: str = "0") -> float:
    """An engine gauge's value for one data-parallel rank (``smg_servicer_engine_*``); fails
    when the worker does not export it for that rank."""
    key = (f"smg_servicer_engine_{name}", frozenset({("dp_rank", dp_rank)}))
    assert key in samples, (
        f"no {key[0]}{{dp_rank={dp_rank!r}}} among {sorted({n for n, _ in samples})}"
    )
    return samples[key]


def total(samples: Samples, name: str) -> float:
    """The sum of every sample called ``name``, whatever its labels (0 when absent)."""
    return sum(v for (sample, _), v in samples.items() if sample == name)


def scrape_https(port: int, ca: Path, client: tuple[Path, Path] | None = None) -> str:
    """``https://127.0.0.1:port/metrics`` as text, the server verified against ``ca``, with the
    client certificate ``client`` (cert, key) when given."""
    context = ssl.create_default_context(cafile=str(ca))
    if client is not None:
        context.load_cert_chain(str(client[0]), str(client[1]))
    url = f"https://127.0.0.1:{port}/metrics"
    with urllib.request.urlopen(url, context=context, timeout=10) as response:
        return response.read().decode()


def family_names(port: int, host: str = "127.0.0.1") -> set[str]:
    """The metric families ``http://host:port/metrics`` exports (counters without ``_total``)."""
    return {family.name for family in _families(port, host)}


@dataclass
class Workload:
    tokens: int = 0
    messages: int = 0
    codes: Counter[str] = field(default_factory=Counter[str])


def _tokens(message: Any, chunked: bool) -> int:
    kind = message.WhichOneof("response")
    if kind == "chunk":
        return len(message.chunk.token_ids)
    if kind == "complete" and not chunked:
        return len(message.complete.output_ids)
    return 0


async def _run(stub: Any, request: Any, work: Workload, abort_after_first: Any = None) -> None:
    call = stub.Generate(request)
    chunked = False
    try:
        async for message in call:
            work.messages += 1
            work.tokens += _tokens(message, chunked)
            chunked = chunked or message.WhichOneof("response") == "chunk"
            if abort_after_first is not None:
                await abort_after_first()
                abort_after_first = None
        work.codes["OK"] += 1
    except grpc.aio.AioRpcError as err:
        work.codes[err.code().name] += 1


async def metrics_workload(stub: Any, wire: Wire, prompt: list[int]) -> Workload:
    """The workload of the module docstring, against ``stub`` (a ``Generate``/``Abort`` stub)."""
    module, _ = WIRES[wire]
    work = Workload()

    def request(stream: bool, max_tokens: int = 4, ids: list[int] | None = None) -> Any:
        return generate_request(
            wire, prompt if ids is None else ids, max_tokens=max_tokens, stream=stream,
            ignore_eos=True, temperature=0.0,
        )  # fmt: skip

    await asyncio.gather(*(_run(stub, request(True), work) for _ in range(2)))
    await _run(stub, request(False), work)
    await _run(stub, request(True, ids=[]), work)
    long_one = request(True, max_tokens=200)
    long_one.request_id = next_request_id("abort")
    fields = module.AbortRequest.DESCRIPTOR.fields_by_name
    abort = (
        module.AbortRequest(request_ids=[long_one.request_id])
        if "request_ids" in fields
        else module.AbortRequest(request_id=long_one.request_id)
    )

    async def stop() -> None:
        await stub.Abort(abort)

    await _run(stub, long_one, work, abort_after_first=stop)
    return work


def assert_workload_counted(
    samples: Samples, work: Workload, before: Samples | None = None
) -> None:
    """The servicer's counters match what the client saw (minus ``before``, if given)."""

    def delta(name: str, **labels: str) -> float:
        return value(samples, name, **labels) - (value(before, name, **labels) if before else 0)

    assert delta("smg_servicer_generate_output_tokens_total") == work.tokens
    assert delta("smg_servicer_generate_messages_total") == work.messages
    for code, count in work.codes.items():
        assert delta("smg_servicer_rpc_requests_total", rpc="Generate", code=code) == count, code
    assert delta("smg_servicer_requests_refused_total", reason="invalid_argument") == 1
    assert delta("smg_servicer_generate_aborts_total", cause="abort_rpc") == 1
    assert delta("smg_servicer_generate_aborts_total", cause="client_cancel") == 0
    assert delta("smg_servicer_rpc_requests_total", rpc="Abort", code="OK") == 1
    assert value(samples, "smg_servicer_generate_streams_in_flight") == 0
    assert delta("smg_servicer_generate_time_to_first_token_seconds_count") == sum(
        c for code, c in work.codes.items() if code != "INVALID_ARGUMENT"
    )

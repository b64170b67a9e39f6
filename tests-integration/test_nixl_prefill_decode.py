"""A prefill worker and a decode worker of vLLM CPU, each behind our servicer (vLLM's own gRPC
launcher), moving the prompt's KV with vLLM's ``NixlConnector`` (NIXL's UCX backend over TCP: it
runs on CPU). Text and images (the tiny float32 Idefics3, which serves both):

- the prefill worker hands back ``kv_transfer_params`` naming itself; the decode worker, given
  them, continues from the transferred KV (shown: a decode prompt whose ids say something else
  continues the prefilled prompt, not its own);
- an image prefilled from a media ref comes back with its ``media_identity`` (expanded prompt ids,
  the item's hash and placeholder, no pixels), and the decode worker serves that identity alone
  as the worker-alone image request would be served;
- a request without pixels is refused where no remote prefill brings its KV;
- the real router's ``--pd-disaggregation`` pairs the two and serves chat and completions,
  streaming and not, as one worker alone answers them.

Not under ``-k vllm`` (the vLLM 0.27 job has no NIXL): the names here avoid the word."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest

from smg_it.harness import Worker
from smg_servicer_core.proto import vllm_engine_pb2 as pb
from smg_servicer_core.proto import vllm_engine_pb2_grpc as pb_grpc
from smg_servicer_core.testing import generate_request
from smg_servicer_core.testing.media import png_image
from smg_servicer_core.testing.process import free_port
from smg_servicer_core.testing.requests import SERVICES
from smg_servicer_core.testing.router import Router

#: Two VLM workers start in the module's fixture, each bounded at 420 s (below): the suite's
#: 300 s per-test timeout cut the first one's start in a gate run (2026-12-07) before its own
#: bound could apply.
pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

MAX_TOKENS = 8
#: Longer than two of vLLM's CPU KV blocks (128 tokens): most of the prompt moves as KV.
PROMPT = [1] + [7 + i % 50 for i in range(300)]
#: The same length and last token, every other id different: continued from its own KV it says
#: something else than ``PROMPT`` does.
OTHER = [1] + [60 + i % 37 for i in range(299)] + [PROMPT[-1]]


@pytest.fixture(scope="module")
def media_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("pd-media")
    (folder / "a.png").write_bytes(png_image(40, 50, seed=1))
    return folder


def _worker(model: Path, role: str, media_dir: Path) -> Worker:
    from smg_servicer_vllm.testing import launcher_command

    port = free_port()
    config = {"kv_connector": "NixlConnector", "kv_role": role, "kv_buffer_device": "cpu"}
    extra = (
        ("--kv-transfer-config", json.dumps(config)),
        ("--mm-processor", "inprocess", "--allowed-local-media-path", str(media_dir)),
        ("--limit-mm-per-prompt", '{"image": 1}'),
    )
    cmd = launcher_command(model, port, *(flag for group in extra for flag in group))
    # NIXL's side channel (the decode worker reads the prefill worker's block layout there).
    env = {
        "VLLM_NIXL_SIDE_CHANNEL_HOST": "127.0.0.1",
        "VLLM_NIXL_SIDE_CHANNEL_PORT": str(free_port()),
    }
    # A bound, not a wait: two VLM workers starting beside the other test lane took over 240 s
    # in a gate run.
    return Worker(cmd, port, service=SERVICES["vllm"], start_timeout_s=420, env=env)


@pytest.fixture(scope="module")
def pair(
    tiny_vlm: Path, media_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Worker, Worker]]:
    """The prefill worker (``kv_producer``) and the decode worker (``kv_consumer``). Only the
    prefill worker may read the media folder: the decode side is served without the media."""
    prefill = _worker(tiny_vlm, "kv_producer", media_dir)
    decode = _worker(tiny_vlm, "kv_consumer", tmp_path_factory.mktemp("no-media"))
    with prefill, decode:
        for worker in (prefill, decode):
            assert worker.process is not None
            worker.process.wait_serving(420)
        yield prefill, decode


def _request(rid: str, ids: list[int], max_tokens: int, kv: dict[str, Any] | None = None) -> Any:
    request = generate_request(
        "vllm", ids, max_tokens=max_tokens, temperature=0.0, ignore_eos=True, request_id=rid
    )
    if kv is not None:
        request.kv_transfer_params_json = json.dumps(kv)
    return request


async def _complete(worker: Worker, request: Any) -> pb.GenerateComplete:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{worker.port}") as channel:
        stub = pb_grpc.VllmEngineStub(channel)
        responses = [r async for r in stub.Generate(request, timeout=120)]
    return responses[-1].complete


async def _prefill(worker: Worker, request: Any) -> tuple[pb.GenerateComplete, dict[str, Any]]:
    """``request`` on the prefill worker asking for a remote decode: its completion and the
    ``kv_transfer_params`` it hands to the decode side."""
    request.kv_transfer_params_json = json.dumps({"do_remote_decode": True})
    request.sampling_params.max_tokens = 1
    done = await _complete(worker, request)
    return done, json.loads(done.kv_transfer_params_json)


async def _server_info(worker: Worker) -> pb.GetServerInfoResponse:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{worker.port}") as channel:
        return await pb_grpc.VllmEngineStub(channel).GetServerInfo(pb.GetServerInfoRequest())


def test_each_worker_reports_the_connector_and_its_role(pair: tuple[Worker, Worker]) -> None:
    prefill, decode = (asyncio.run(_server_info(w)) for w in pair)
    assert (prefill.kv_connector, prefill.kv_role) == ("NixlConnector", "kv_producer")
    assert (decode.kv_connector, decode.kv_role) == ("NixlConnector", "kv_consumer")
    assert prefill.kv_engine_id and prefill.kv_engine_id != decode.kv_engine_id


def test_the_decode_worker_continues_from_the_transferred_kv(pair: tuple[Worker, Worker]) -> None:
    prefill, decode = pair

    async def run() -> None:
        # References: each prompt on one worker alone (the prefill worker, no transfer).
        want = await _complete(prefill, _request("ref-prompt", PROMPT, MAX_TOKENS))
        other = await _complete(prefill, _request("ref-other", OTHER, MAX_TOKENS))
        assert list(want.output_ids) != list(other.output_ids)

        first, kv = await _prefill(prefill, _request("pd-1", PROMPT, MAX_TOKENS))
        assert first.completion_tokens == 1
        info = await _server_info(prefill)
        assert kv["do_remote_prefill"] is True and kv["remote_engine_id"] == info.kv_engine_id
        assert kv["remote_block_ids"] and kv["remote_num_tokens"] == len(PROMPT)
        got = await _complete(decode, _request("pd-1", PROMPT, MAX_TOKENS, kv))
        assert list(got.output_ids) == list(want.output_ids)
        assert (got.prompt_tokens, got.completion_tokens) == (len(PROMPT), MAX_TOKENS)

        # The decode worker computes only the last position itself: given PROMPT's KV under
        # OTHER's ids (same last token), it continues PROMPT.
        _, kv = await _prefill(prefill, _request("pd-2", PROMPT, MAX_TOKENS))
        swapped = await _complete(decode, _request("pd-2", OTHER, MAX_TOKENS, kv))
        assert list(swapped.output_ids) == list(want.output_ids)

    asyncio.run(run())


def test_a_decode_request_refused_here_is_reported_to_the_connector(
    pair: tuple[Worker, Worker],
) -> None:
    """The notice that frees the prefill worker's blocks, taken by the real engine (the fake
    engine's tests cover when it is owed and withheld: test_kv_transfer.py)."""
    prefill, decode = pair

    async def run() -> None:
        _, kv = await _prefill(prefill, _request("pd-refused", PROMPT, MAX_TOKENS))
        bad = _request("pd-refused", PROMPT, MAX_TOKENS, kv)
        bad.sampling_params.top_p = 2.0
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await _complete(decode, bad)
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        told = "request pd-refused was refused before the engine: the KV connector is told"
        for _ in range(150):  # sent in the background, bounded at 10 s
            if told in decode.log.read_text(errors="replace"):
                return
            await asyncio.sleep(0.1)
        raise AssertionError(f"no notice in the decode worker's log: {told!r}")

    asyncio.run(run())


def test_an_image_is_decoded_from_its_identity_without_pixels(
    pair: tuple[Worker, Worker], tiny_vlm: Path, media_dir: Path
) -> None:
    from smg_servicer_vllm.testing.multimodal import media_request, vlm_prompts

    prefill, decode = pair
    ids = vlm_prompts(tiny_vlm)
    url = (media_dir / "a.png").as_uri()

    async def run() -> None:
        want = await _complete(prefill, media_request(ids["one"], url, request_id="ref-image"))
        first, kv = await _prefill(prefill, media_request(ids["one"], url, request_id="pd-image"))
        identity = first.media_identity
        # The anchor expanded, as the prefill worker's engine saw the prompt.
        assert len(identity.prompt_token_ids) == first.prompt_tokens > len(ids["one"])
        batch = identity.mm_inputs
        assert len(batch.mm_hashes) == len(batch.mm_placeholders) == 1
        assert batch.im_token_id == ids["<image>"] and not batch.HasField("pixel_values")
        assert not identity.extra_mm_inputs

        decode_side = _request("pd-image", list(identity.prompt_token_ids), MAX_TOKENS, kv)
        decode_side.mm_inputs.CopyFrom(batch)
        got = await _complete(decode, decode_side)
        assert list(got.output_ids) == list(want.output_ids)
        assert got.prompt_tokens == first.prompt_tokens
        # The image came with the KV: the same ids read as text say something else.
        as_text = _request("as-text", list(identity.prompt_token_ids), MAX_TOKENS)
        assert list((await _complete(prefill, as_text)).output_ids) != list(want.output_ids)

        # A text request on the prefill worker asking for a remote decode has no identity.
        text, _ = await _prefill(prefill, _request("pd-text", PROMPT, MAX_TOKENS))
        assert not text.HasField("media_identity")

        # Without a remote prefill nothing would bring the image's KV: refused, not guessed.
        alone = _request("no-prefill", list(identity.prompt_token_ids), MAX_TOKENS)
        alone.mm_inputs.CopyFrom(batch)
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await _complete(decode, alone)
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "do_remote_prefill" in (refused.value.details() or "")

    asyncio.run(run())


def test_the_router_splits_chat_and_completions_over_the_pair(
    pair: tuple[Worker, Worker], tiny_vlm: Path, media_dir: Path
) -> None:
    """``--pd-disaggregation`` with the pair: the router pairs them by their NIXL labels, and
    chat (with an image too, which only the prefill worker can read) and completions, streaming
    and not, answer with usage as the prefill worker alone answers them (greedy), every request
    selecting both workers."""
    prefill, decode = pair
    model = str(tiny_vlm)
    image = {"type": "image_url", "image_url": {"url": (media_dir / "a.png").as_uri()}}
    requests = {
        "/v1/completions": {"model": model, "prompt": "hello there", "max_tokens": 6},
        "/v1/chat/completions": {
            "model": model,
            "messages": [{"role": "user", "content": "say something"}],
            "max_tokens": 6,
        },
        "/v1/chat/completions#image": {
            "model": model,
            "messages": [{"role": "user", "content": [image, {"type": "text", "text": "what?"}]}],
            "max_tokens": 6,
        },
    }
    media = ("--mm-processing", "worker")
    with Router(prefill.url, *media) as alone:  # the same requests on one worker, no split
        want = {path: _ask(alone.base, path, body, stream=False) for path, body in requests.items()}
    with Router(
        prefill.url, *media, "--pd-disaggregation", "--prefill", prefill.url, "--decode", decode.url
    ) as router:
        workers = httpx.get(router.base + "/workers", timeout=10).json()["workers"]
        labels = {w["url"]: (w["worker_type"], w["kv_connector"]) for w in workers}
        assert labels == {
            prefill.url: ("prefill", "NixlConnector"),
            decode.url: ("decode", "NixlConnector"),
        }
        for path, body in requests.items():
            for stream in (False, True):
                assert _ask(router.base, path, body, stream=stream) == want[path], (path, stream)
        selections = _selections(router)
    assert selections == {"prefill": 2 * len(requests), "decode": 2 * len(requests)}, selections


def _ask(base: str, path: str, body: dict[str, Any], *, stream: bool) -> tuple[str, int, int]:
    """(text, prompt tokens, completion tokens) of a greedy request, streamed or not."""
    body = body | {"temperature": 0, "stream": stream}
    if stream:
        body["stream_options"] = {"include_usage": True}
    reply = httpx.post(base + path.partition("#")[0], json=body, timeout=120)
    assert reply.status_code == 200, reply.text
    if not stream:
        data = reply.json()
        choice = data["choices"][0]
        text = choice["text"] if "text" in choice else choice["message"]["content"]
        usage = data["usage"]
        return text, usage["prompt_tokens"], usage["completion_tokens"]
    text, usage = "", {}
    for line in reply.text.splitlines():
        if not line.startswith("data: {"):
            continue
        event = json.loads(line.removeprefix("data: "))
        for choice in event["choices"]:
            text += choice.get("text") or (choice.get("delta") or {}).get("content") or ""
        usage = event.get("usage") or usage
    return text, usage["prompt_tokens"], usage["completion_tokens"]


def _selections(router: Router) -> dict[str, int]:
    """How many times the router picked a worker of each PD role (its Prometheus counter)."""
    metrics = httpx.get(f"http://127.0.0.1:{router.metrics_port}/metrics", timeout=10).text
    counts: dict[str, int] = {}
    for line in metrics.splitlines():
        if line.startswith("smg_worker_selection_total{"):
            role = line.split('worker_type="', 1)[1].split('"', 1)[0]
            counts[role] = counts.get(role, 0) + int(float(line.rsplit(" ", 1)[1]))
    return counts

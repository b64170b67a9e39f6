"""Images on the real vLLM CPU engine (tiny float32 Idefics3): media refs (``--mm-processor
inprocess``) and router-preprocessed tensors (inline and shared memory) give the greedy ids of
vLLM's own in-process ``AsyncLLM.generate`` with the same image; every refusal is
INVALID_ARGUMENT (or UNAVAILABLE past ``--mm-max-inflight``) and leaves the worker generating."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import pytest_asyncio

from smg_it.fuzz_mm import to_shm
from smg_servicer_core.proto import common_pb2
from smg_servicer_core.proto import vllm_engine_pb2 as pb
from smg_servicer_core.testing import generate_request
from smg_servicer_core.testing.media import MediaServer, data_url, png_image
from smg_servicer_core.testing.tiny_vlm import AnchorLayout, anchor_layout
from smg_servicer_vllm.mm_settings import MmSettings
from smg_servicer_vllm.testing.multimodal import (
    MAX_TOKENS,
    complete,
    media_request,
    pil,
    put_inline,
    reference,
    vlm_prompts,
)

pytestmark = [pytest.mark.engine, pytest.mark.asyncio(loop_scope="session")]

IMAGE_LIMIT = 2  # the session VLM engine's --limit-mm-per-prompt (conftest.vlm_llm)


@pytest.fixture(scope="module")
def media_server() -> Iterator[MediaServer]:
    with MediaServer() as server:
        server.put("/a.png", png_image(40, 50, seed=1))
        server.put("/slow.png", png_image(40, 50, seed=1), delay_s=3.0)
        server.put("/stalled.png", png_image(40, 50, seed=1), delay_s=60.0)
        server.put("/held.png", png_image(40, 50, seed=1), delay_s=60.0)
        server.put("/gone.png", status=404)
        server.put("/flaky.png", status=503)
        yield server


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def vlm(vlm_llm: Any, serve_llm: Any) -> AsyncIterator[tuple[Any, Any]]:
    # The media server is on 127.0.0.1: a worker that fetches from it needs the opt-in.
    settings = MmSettings(processor="inprocess", source="flag", allow_private_media_hosts=True)
    async with serve_llm(vlm_llm, settings) as stack:
        yield stack


@pytest.fixture(scope="module")
def ids(tiny_vlm: Path) -> dict[str, Any]:
    return vlm_prompts(tiny_vlm)


@pytest.fixture(scope="module")
def layout(tiny_vlm: Path) -> dict[str, AnchorLayout]:
    """What one anchor becomes for the media folder's pictures (a.png 40x50, b.png 64x30)."""
    return {"a": anchor_layout(tiny_vlm, 40, 50), "b": anchor_layout(tiny_vlm, 64, 30)}


async def refused(stub: Any, request: pb.GenerateRequest) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await complete(stub, request)
    return info.value


# Media refs --------------------------------------------------------------------------------------


async def test_a_data_url_gives_the_engines_own_ids(vlm, vlm_llm, ids, layout) -> None:
    _, stub = vlm
    image = png_image(40, 50, seed=1)
    want, prompt_len = await reference(vlm_llm, ids["one"], [image])
    got = await complete(stub, media_request(ids["one"], data_url(image)))
    assert list(got.output_ids) == want
    # The worker expanded the one anchor (7 positions, 4 embeddings without image splitting).
    assert got.prompt_tokens == prompt_len == len(ids["one"]) + layout["a"].positions - 1


async def test_a_file_url_and_an_http_url_give_the_same_ids(
    vlm, vlm_llm, ids, media_dir, media_server
) -> None:
    _, stub = vlm
    want, _ = await reference(vlm_llm, ids["one"], [png_image(40, 50, seed=1)])
    from_file = await complete(stub, media_request(ids["one"], (media_dir / "a.png").as_uri()))
    from_http = await complete(stub, media_request(ids["one"], media_server.url("/a.png")))
    assert list(from_file.output_ids) == list(from_http.output_ids) == want


async def test_two_images_in_one_prompt(vlm, vlm_llm, ids, media_dir, layout) -> None:
    _, stub = vlm
    a, b = (media_dir / "a.png").read_bytes(), (media_dir / "b.png").read_bytes()
    want, prompt_len = await reference(vlm_llm, ids["two"], [a, b])
    got = await complete(
        stub, media_request(ids["two"], data_url(a), (media_dir / "b.png").as_uri())
    )
    assert list(got.output_ids) == want
    expanded = layout["a"].positions + layout["b"].positions - 2
    assert got.prompt_tokens == prompt_len == len(ids["two"]) + expanded


async def test_streaming_a_media_ref(vlm, vlm_llm, ids) -> None:
    _, stub = vlm
    image = png_image(40, 50, seed=1)
    want, _ = await reference(vlm_llm, ids["one"], [image])
    responses = [
        r async for r in stub.Generate(media_request(ids["one"], data_url(image), stream=True))
    ]
    streamed = [t for r in responses if r.HasField("chunk") for t in r.chunk.token_ids]
    assert streamed == want
    assert responses[-1].complete.finish_reason == "length"


def _refusals(
    ids: dict[str, Any], media_dir: Path, media_server: MediaServer
) -> dict[str, tuple[pb.GenerateRequest, str]]:
    image = data_url(png_image(40, 50, seed=1))
    text_input = media_request(ids["one"], image)
    text_input.text = "<image>describe"
    with_tensors = media_request(ids["one"], image)
    with_tensors.mm_inputs.im_token_id = ids["<image>"]
    return {
        "scheme": (
            media_request(ids["one"], "ftp://127.0.0.1/a.png"),
            "scheme 'ftp' is not accepted",
        ),
        "no url": (media_request(ids["one"], ""), "url is empty"),
        "outside the local path": (
            media_request(ids["one"], "file:///etc/hostname"),
            "outside --allowed-local-media-path",
        ),
        "missing file": (
            media_request(ids["one"], (media_dir / "nope.png").as_uri()),
            "does not exist",
        ),
        "refused host": (
            media_request(ids["one"], "http://localhost:1/a.png"),
            "not in --allowed-media-domains",
        ),
        "http 404": (media_request(ids["one"], media_server.url("/gone.png")), "answered HTTP 404"),
        "undecodable": (
            media_request(ids["one"], (media_dir / "broken.png").as_uri()),
            "could not be read as image",
        ),
        "undecodable data": (
            media_request(ids["one"], data_url(b"garbage")),
            "could not be read as image",
        ),
        "not base64": (media_request(ids["one"], "data:image/png,raw"), "only base64 data: URLs"),
        "fewer anchors": (media_request(ids["one"], image, image), "1 image anchor(s) (token"),
        "no anchor": (media_request(ids["none"], image), "0 image anchor(s)"),
        "over the item limit": (
            media_request(ids["two"] + [ids["<image>"]], image, image, image),
            "more than 2 image item(s)",
        ),
        "text input": (text_input, "needs tokenized input"),
        "both kinds": (with_tensors, "mutually exclusive"),
    }


REFUSALS = [
    "scheme",
    "no url",
    "outside the local path",
    "missing file",
    "refused host",
    "http 404",
    "undecodable",
    "undecodable data",
    "not base64",
    "fewer anchors",
    "no anchor",
    "over the item limit",
    "text input",
    "both kinds",
]


@pytest.mark.parametrize("case", REFUSALS)
async def test_a_bad_media_ref_is_invalid_argument_and_the_worker_goes_on(
    vlm, ids, media_dir, media_server, case
) -> None:
    _, stub = vlm
    request, message = _refusals(ids, media_dir, media_server)[case]
    error = await refused(stub, request)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, error.details()
    assert message in (error.details() or "")
    assert "Traceback" not in (error.details() or "")
    assert (await stub.HealthCheck(pb.HealthCheckRequest())).healthy
    after = await complete(stub, media_request(ids["one"], data_url(png_image(40, 50, seed=1))))
    assert after.completion_tokens == MAX_TOKENS


async def test_an_abort_during_the_fetch_stops_the_request(vlm, ids, media_server) -> None:
    _, stub = vlm
    request = media_request(ids["one"], media_server.url("/held.png"))
    call = asyncio.ensure_future(complete(stub, request))
    assert await asyncio.to_thread(media_server.hit("/held.png").wait, 30)
    started = time.monotonic()
    await stub.Abort(pb.AbortRequest(request_ids=[request.request_id]))
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call
    assert info.value.code() == grpc.StatusCode.ABORTED
    assert time.monotonic() - started < 5  # not after the 60-second fetch
    assert (await stub.GetServerInfo(pb.GetServerInfoRequest())).active_requests == 0


async def test_an_upstream_5xx_is_unavailable(vlm, ids, media_server) -> None:
    _, stub = vlm
    error = await refused(stub, media_request(ids["one"], media_server.url("/flaky.png")))
    assert error.code() == grpc.StatusCode.UNAVAILABLE
    assert "answered HTTP 503" in (error.details() or "")


async def test_a_fetch_timeout_is_unavailable(vlm, ids, media_server, monkeypatch) -> None:
    """``VLLM_IMAGE_FETCH_TIMEOUT`` (vLLM's own setting; one attempt here) bounds the fetch."""
    import vllm.envs

    monkeypatch.setenv("VLLM_IMAGE_FETCH_TIMEOUT", "1")
    monkeypatch.setenv("VLLM_MEDIA_FETCH_MAX_RETRIES", "1")
    if vllm.envs.VLLM_IMAGE_FETCH_TIMEOUT != 1:  # pragma: no cover - a vLLM that caches envs
        pytest.fail("vLLM did not read VLLM_IMAGE_FETCH_TIMEOUT at fetch time")
    _, stub = vlm
    error = await refused(stub, media_request(ids["one"], media_server.url("/stalled.png")))
    assert error.code() == grpc.StatusCode.UNAVAILABLE
    assert "timed out" in (error.details() or "")


async def test_an_inline_item_over_the_byte_cap_is_refused(vlm_llm, serve_llm, ids) -> None:
    settings = MmSettings(processor="inprocess", max_item_bytes=1000)
    async with serve_llm(vlm_llm, settings) as (_, stub):
        error = await refused(stub, media_request(ids["one"], data_url(png_image(100, 100))))
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "over the 1000-byte limit (--mm-max-item-bytes)" in (error.details() or "")


async def test_media_refs_on_a_worker_with_processing_off(vlm_llm, serve_llm, ids) -> None:
    async with serve_llm(vlm_llm, MmSettings(processor="off")) as (_, stub):
        error = await refused(stub, media_request(ids["one"], data_url(png_image())))
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "--mm-processor (SMG_VLLM_MM_PROCESSOR) is off" in (error.details() or "")


async def test_past_mm_max_inflight_a_request_is_unavailable(
    vlm_llm, serve_llm, ids, media_server
) -> None:
    settings = MmSettings(processor="inprocess", max_inflight=1, allow_private_media_hosts=True)
    async with serve_llm(vlm_llm, settings) as (_, stub):
        slow = asyncio.ensure_future(
            complete(stub, media_request(ids["one"], media_server.url("/slow.png")))
        )
        assert await asyncio.to_thread(media_server.hit("/slow.png").wait, 30)
        error = await refused(stub, media_request(ids["one"], data_url(png_image(40, 50, seed=1))))
        assert error.code() == grpc.StatusCode.UNAVAILABLE
        assert "worker is saturated" in (error.details() or "")
        assert (await slow).completion_tokens == MAX_TOKENS


async def test_without_the_opt_in_a_loopback_host_is_refused_unfetched(
    vlm_llm, serve_llm, ids, media_server
) -> None:
    """The default worker (no --mm-allow-private-media-hosts) over the same engine: the media
    server's 127.0.0.1 URL (in the engine's --allowed-media-domains) is INVALID_ARGUMENT naming
    the rule, and the server never sees the request; the worker goes on."""
    async with serve_llm(vlm_llm, MmSettings(processor="inprocess")) as (_, stub):
        error = await refused(stub, media_request(ids["one"], media_server.url("/never.png")))
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, error.details()
        assert error.details() == (
            "media_refs.items[0]: the URL's host resolves to a loopback address (refused: "
            "private media hosts are off; --mm-allow-private-media-hosts allows them)"
        )
        assert not media_server.hit("/never.png").is_set()
        after = await complete(stub, media_request(ids["one"], data_url(png_image(40, 50, seed=1))))
        assert after.completion_tokens == MAX_TOKENS


# Preprocessed tensors ----------------------------------------------------------------------------


async def processed(llm: Any, ids: list[int], images: list[bytes]) -> Any:
    """vLLM's own processor output for the images (what a router spec would send)."""
    data = [pil(i) for i in images]
    prompt = {
        "prompt_token_ids": ids,
        "multi_modal_data": {"image": data[0] if len(data) == 1 else data},
    }
    return await llm.renderer.process_for_engine_async(prompt, time.time(), skip_mm_cache=True)


def still_there(name: str) -> bool:
    return Path("/dev/shm", name).exists()


def put_tensor(message: Any, tensor: Any, shm: list[Any] | None) -> None:
    """``tensor`` into a ``TensorData``: inline bytes, or a new shared-memory segment."""
    put_inline(message, tensor)
    if shm is not None:
        to_shm(message, shm)


def tensor_request(
    engine_input: Any, image_token: int, *, shm: list[Any] | None = None
) -> pb.GenerateRequest:
    """The request a router sends for vLLM's processed input: expanded ids plus the tensors."""
    import torch

    request = media_request(list(engine_input["prompt_token_ids"]))
    items = engine_input["mm_kwargs"]["image"]
    batch = request.mm_inputs
    batch.modality = common_pb2.IMAGE
    batch.im_token_id = image_token
    stacked = {
        key: torch.cat(
            [
                item[key].data.reshape(-1, *item[key].data.shape[1:])
                if item[key].data.dim()
                else item[key].data.reshape(1)
                for item in items
            ]
        )
        for key in items[0]
    }
    put_tensor(batch.pixel_values, stacked["pixel_values"], shm)
    for key in ("pixel_attention_mask", "num_patches"):
        put_tensor(batch.model_specific_tensors[key], stacked[key], shm)
    batch.flat_keys["pixel_values"] = "num_patches"
    batch.flat_keys["pixel_attention_mask"] = "num_patches"
    batch.batched_keys.append("num_patches")
    batch.keep_on_cpu_keys.append("num_patches")
    for placeholder in engine_input["mm_placeholders"]["image"]:
        batch.mm_placeholders.add(offset=placeholder.offset, length=placeholder.length)
    batch.mm_hashes.extend(engine_input["mm_hashes"]["image"])
    return request


async def test_preprocessed_tensors_inline_give_the_same_ids(vlm, vlm_llm, ids) -> None:
    _, stub = vlm
    image = png_image(40, 50, seed=1)
    want, prompt_len = await reference(vlm_llm, ids["one"], [image])
    engine_input = await processed(vlm_llm, ids["one"], [image])
    got = await complete(stub, tensor_request(engine_input, ids["<image>"]))
    assert list(got.output_ids) == want
    assert got.prompt_tokens == prompt_len


async def test_preprocessed_tensors_in_shared_memory_are_read_then_unlinked(
    vlm, vlm_llm, ids, media_dir
) -> None:
    _, stub = vlm
    images = [(media_dir / "a.png").read_bytes(), (media_dir / "b.png").read_bytes()]
    want, _ = await reference(vlm_llm, ids["two"], images)
    segments: list[Any] = []
    engine_input = await processed(vlm_llm, ids["two"], images)
    got = await complete(stub, tensor_request(engine_input, ids["<image>"], shm=segments))
    assert list(got.output_ids) == want
    assert segments and not any(still_there(s.name) for s in segments)
    for segment in segments:
        segment.close()


def _broken_tensors(
    engine_input: Any, image_token: int, layout: AnchorLayout
) -> dict[str, tuple[pb.GenerateRequest, str]]:
    def variant(edit: Any) -> pb.GenerateRequest:
        request = tensor_request(engine_input, image_token)
        edit(request.mm_inputs)
        return request

    def bad_shm(b: Any) -> None:
        size = len(b.pixel_values.inline)  # setting the shm handle clears the inline bytes
        b.pixel_values.shm.name, b.pixel_values.shm.offset = "smg-no-such-segment", 0
        b.pixel_values.shm.nbytes = size

    return {
        "unknown dtype": (
            variant(lambda b: setattr(b.pixel_values, "dtype", "complex64")),
            "dtype 'complex64'",
        ),
        "shape and size disagree": (
            variant(lambda b: b.pixel_values.shape.__setitem__(0, 2)),
            "bytes, got",
        ),
        "bad shared-memory handle": (variant(bad_shm), "cannot be opened"),
        "traversal in the handle": (
            variant(lambda b: (bad_shm(b), setattr(b.pixel_values.shm, "name", "../etc/passwd"))),
            "is not valid",
        ),
        "placeholder outside the prompt": (
            variant(lambda b: setattr(b.mm_placeholders[0], "offset", 10_000)),
            "outside the",
        ),
        "no placeholders": (
            variant(lambda b: b.ClearField("mm_placeholders")),
            "mm_placeholders is empty",
        ),
        "missing sizes tensor": (
            variant(lambda b: b.flat_keys.__setitem__("pixel_values", "nope")),
            "names sizes tensor",
        ),
        "no pixels": (variant(lambda b: b.ClearField("pixel_values")), "pixel_values is missing"),
        # Without im_token_id every position of the range (7) would take one of the embeddings
        # the encoder makes (4): the engine would fail on it and die.
        "more embeddings than the model makes": (
            variant(lambda b: b.ClearField("im_token_id")),
            f"{layout.positions} embedding positions, more than the {layout.embeddings}",
        ),
    }


def _no_placeholders(request: Any) -> None:
    request.mm_inputs.ClearField("mm_placeholders")


def _bad_sampling(request: Any) -> None:
    request.sampling_params.top_p = 2.0  # refused after the media checks passed


@pytest.mark.parametrize("refuse", [_no_placeholders, _bad_sampling], ids=["media", "sampling"])
async def test_a_refused_request_frees_its_shared_memory(vlm, vlm_llm, ids, refuse) -> None:
    """Refused as the client's fault before any tensor was read (by the media checks, or by a
    check after them): the segments go anyway."""
    _, stub = vlm
    engine_input = await processed(vlm_llm, ids["one"], [png_image(40, 50, seed=1)])
    segments: list[Any] = []
    request = tensor_request(engine_input, ids["<image>"], shm=segments)
    refuse(request)
    error = await refused(stub, request)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert segments and not any(still_there(s.name) for s in segments)
    for segment in segments:
        segment.close()


BROKEN = [
    "unknown dtype",
    "shape and size disagree",
    "bad shared-memory handle",
    "traversal in the handle",
    "placeholder outside the prompt",
    "no placeholders",
    "missing sizes tensor",
    "no pixels",
    "more embeddings than the model makes",
]


@pytest.mark.parametrize("case", BROKEN)
async def test_a_bad_tensor_is_invalid_argument(vlm, vlm_llm, ids, layout, case) -> None:
    _, stub = vlm
    engine_input = await processed(vlm_llm, ids["one"], [png_image(40, 50, seed=1)])
    request, message = _broken_tensors(engine_input, ids["<image>"], layout["a"])[case]
    error = await refused(stub, request)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, error.details()
    assert message in (error.details() or "")
    ok = await complete(stub, tensor_request(engine_input, ids["<image>"]))
    assert ok.completion_tokens == MAX_TOKENS


# What the worker advertises ----------------------------------------------------------------------


async def test_the_worker_advertises_its_media_processing(vlm) -> None:
    _, stub = vlm
    info = await stub.GetServerInfo(pb.GetServerInfoRequest())
    assert info.mm_processor == "inprocess"
    assert info.mm_processor_source == "flag"
    assert info.mm_media_ref_schemes == "http,https,data,file"
    assert info.mm_item_limits == f"image={IMAGE_LIMIT}"
    assert info.mm_encoder_budget > 0
    assert info.multimodal_encoder_dtype == "float32"
    assert info.max_num_seqs > 0
    assert info.shm_namespace_id.count(":") == 1
    model = await stub.GetModelInfo(pb.GetModelInfoRequest())
    assert model.supports_vision


async def test_device_normalization_is_the_engines_own_and_then_takes_uint8_pixels(
    vlm, vlm_llm, ids
) -> None:
    """``mm_device_do_normalize`` is vLLM's resolved setting (Idefics3 does not normalize on the
    device, so vLLM resolves it off), and with it on the worker takes pixels only as uint8:
    float pixels, already normalized by a processor, would be normalized twice."""
    servicer, stub = vlm
    info = await stub.GetServerInfo(pb.GetServerInfoRequest())
    # (a vLLM before the setting has none: off)
    own = getattr(vlm_llm.model_config.multimodal_config, "mm_device_do_normalize", False)
    assert info.mm_device_do_normalize is own is False
    engine_input = await processed(vlm_llm, ids["one"], [png_image(40, 50, seed=1)])
    facts = servicer.multimodal.tensor_facts
    servicer.multimodal.tensor_facts = dataclasses.replace(facts, device_normalize=True)
    try:
        error = await refused(stub, tensor_request(engine_input, ids["<image>"]))
    finally:
        servicer.multimodal.tensor_facts = facts
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error.details() == (
        "mm_inputs.pixel_values: this worker normalizes pixels on its device and takes them as "
        "uint8, not float32"
    )
    ok = await complete(stub, tensor_request(engine_input, ids["<image>"]))
    assert ok.completion_tokens == MAX_TOKENS


async def test_processing_off_advertises_no_processor_but_still_vision(vlm_llm, serve_llm) -> None:
    async with serve_llm(vlm_llm, MmSettings()) as (_, stub):
        info = await stub.GetServerInfo(pb.GetServerInfoRequest())
        assert (info.mm_processor, info.mm_media_ref_schemes) == ("", "")
        assert (await stub.GetModelInfo(pb.GetModelInfoRequest())).supports_vision


async def test_a_text_model_ignores_the_flag_and_takes_no_images(
    async_llm, serve_llm, caplog
) -> None:
    with caplog.at_level("INFO"):
        async with serve_llm(async_llm, MmSettings(processor="inprocess", source="env")) as (
            _,
            stub,
        ):
            info = await stub.GetServerInfo(pb.GetServerInfoRequest())
            model = await stub.GetModelInfo(pb.GetModelInfoRequest())
            request = generate_request("vllm", [1, 2, 3])
            request.media_refs.items.add(modality=common_pb2.IMAGE, url=data_url(png_image()))
            error = await refused(stub, request)
    assert info.mm_processor == "" and not model.supports_vision
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "--mm-processor inprocess is ignored" in caplog.text
    assert "VllmEngineServicer initialized (mm_processor=off, source=env)" in caplog.text


async def test_the_settings_come_from_the_launcher_parse_else_the_environment(
    vlm_llm, serve_llm, monkeypatch, caplog
) -> None:
    """``VllmEngineServicer(async_llm, start_time)`` as vLLM's launcher calls it: the plugin's
    parse when there was one, else the ``SMG_VLLM_MM_*`` variables."""
    import argparse

    from smg_servicer_vllm import plugin

    monkeypatch.setenv("SMG_VLLM_MM_PROCESSOR", "inprocess")
    monkeypatch.setattr(plugin, "_launched", {})
    with caplog.at_level("INFO"):
        async with serve_llm(vlm_llm) as (servicer, _):
            assert servicer.mm_settings.source == "env"
    assert "VllmEngineServicer initialized (mm_processor=inprocess, source=env)" in caplog.text
    assert "SMG_VLLM_MM_PROCESSOR is deprecated" in caplog.text
    caplog.clear()
    parsed = argparse.Namespace(mm_processor="off", mm_max_inflight="2")
    monkeypatch.setattr(plugin, "_launched", {"launch": plugin.resolve_launch(parsed)})
    with caplog.at_level("INFO"):
        async with serve_llm(vlm_llm) as (servicer, stub):
            assert servicer.mm_settings.max_inflight == 2
            assert (await stub.GetServerInfo(pb.GetServerInfoRequest())).mm_processor == ""
    assert "VllmEngineServicer initialized (mm_processor=off, source=flag)" in caplog.text

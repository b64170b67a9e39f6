"""Qwen2-VL pictures on the real SGLang (issue #45), the tiny Qwen2-VL
(``smg_servicer_core.testing.tiny_qwen2_vl``) behind our servicer, two ways, each giving the
greedy ids of SGLang's own engine for the same prompt and PNGs (``sglang.Engine`` with its
processor, no disaggregation):

- **router-preprocessed tensors** on an ordinary worker (``--enable-multimodal``): the flattened
  patches, each picture's ``image_grid_thw`` and its placeholder span, as smg 1.13 sends them
  (read off the router's own request in a developer run), made here with transformers' own
  Qwen2-VL image processor; the servicer builds SGLang's items and M-RoPE positions as SGLang's
  Qwen-VL processor does;
- **encoder disaggregation**: a language-only worker (``--language-only``) and SGLang's own
  encoder server (``python -m sglang.launch_server --encoder-only``). A request's
  ``mm_inputs.image_urls`` go to SGLang's own receiver (``send_encode_request``, as its tokenizer
  manager does): it posts them to the encoder, which computes the embeddings and pushes them over
  ZMQ to the scheduler rank (``zmq_to_scheduler``), which expands the prompt's image token and
  runs the request. Everything there is SGLang's: the encoder server, the receiver, the bootstrap
  server, the scheduler's wait and assembly. SGLang refuses Gemma3 for encoder disaggregation."""

from __future__ import annotations

import os
import socket
import struct
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import grpc
import httpx
import pytest

from smg_it.harness import free_port, stop_tree
from smg_it.paths import model_cache
from smg_it.sglang_reference import MAX_TOKENS, image_cases, picture
from smg_it.sglang_suite import Server, run_reference, start_server
from smg_servicer_core.proto import sglang_scheduler_pb2 as pb
from smg_servicer_core.proto import sglang_scheduler_pb2_grpc as pb_grpc
from smg_servicer_core.testing.media import data_url
from smg_servicer_core.testing.router import Router
from smg_servicer_core.testing.tiny_qwen2_vl import IMAGE_ANCHOR, cached_tiny_qwen2_vl
from smg_servicer_sglang.testing import CPU_ENV, CPU_FLAGS

pytestmark = pytest.mark.engine

CASES = image_cases("qwen2_vl")
#: Both processes on loopback (SGLang's own address look-up needs a route otherwise), and the
#: bootstrap server's health probe of the encoder off (its first probe could race the encoder's
#: start and evict it).
EPD_ENV = {"SGLANG_HOST_IP": "127.0.0.1", "SGLANG_ENCODER_BOOTSTRAP_HEALTH_CHECK_INTERVAL": "0"}
POSITIONS = 4  # a picture's positions in the expanded prompt (tiny_qwen2_vl: 56 x 56)


@pytest.fixture(scope="module")
def qwen2_vl() -> Path:
    return cached_tiny_qwen2_vl(model_cache())


@pytest.fixture(scope="module")
def reference(qwen2_vl: Path) -> dict[str, list[int]]:
    return run_reference(qwen2_vl, "--images")


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=5) as reply:
            return reply.status == 200
    except OSError:
        return False


@pytest.fixture(scope="module")
def encoder(qwen2_vl: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """SGLang's own encoder server; ``.url``, ``.proc``."""
    port = free_port()
    log = tmp_path_factory.mktemp("encoder") / "encoder.log"
    command = [
        sys.executable, "-m", "sglang.launch_server", "--model-path", str(qwen2_vl),
        "--encoder-only", "--encoder-transfer-backend", "zmq_to_scheduler",
        "--host", "127.0.0.1", "--port", str(port), "--image-processor-backend", "pil",
        *CPU_FLAGS,
    ]  # fmt: skip
    env = {**os.environ, **CPU_ENV, **EPD_ENV}
    with log.open("wb") as out:
        proc = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 240
        while not _healthy(url):
            assert proc.poll() is None, log.read_text(errors="replace")[-3000:]
            assert time.monotonic() < deadline, log.read_text(errors="replace")[-3000:]
            time.sleep(0.5)
        yield SimpleNamespace(url=url, proc=proc, log=log)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


@pytest.fixture(scope="module")
def worker(qwen2_vl: Path, encoder: Any) -> Iterator[Server]:
    server = start_server(
        qwen2_vl, "--enable-multimodal", "--image-processor-backend", "pil", "--language-only",
        "--encoder-urls", encoder.url, "--encoder-transfer-backend", "zmq_to_scheduler",
        "--encoder-bootstrap-port", str(free_port()),
        env=EPD_ENV,
    )  # fmt: skip
    try:
        server.wait_serving()
        yield server
    finally:
        code, alive = stop_tree(server)
        assert code == 0, server.tail()
        assert not alive


@pytest.fixture(scope="module")
def stub(worker: Server) -> Iterator[Any]:
    with grpc.insecure_channel(worker.address) as channel:
        yield pb_grpc.SglangSchedulerStub(channel)


def prompt_ids(model: Path, prompt: str) -> list[int]:
    """What the router sends a worker that processes media itself: the prompt tokenized, each
    picture one anchor, unexpanded."""
    from transformers import AutoTokenizer

    return list(AutoTokenizer.from_pretrained(str(model))(prompt)["input_ids"])


def request(ids: list[int], urls: list[str], rid: str = "lo", **mm: Any) -> pb.GenerateRequest:
    return pb.GenerateRequest(
        request_id=rid,
        tokenized=pb.TokenizedInput(input_ids=ids),
        mm_inputs=pb.MultimodalInputs(image_urls=urls, **mm),
        sampling_params=pb.SamplingParams(temperature=0, max_new_tokens=MAX_TOKENS),
    )


def generate(stub: Any, message: pb.GenerateRequest) -> Any:
    return list(stub.Generate(message, timeout=120))[-1].complete


def healthy(stub: Any) -> bool:
    return bool(stub.HealthCheck(pb.HealthCheckRequest(), timeout=30).healthy)


@pytest.fixture(scope="module")
def vision_stub(qwen2_vl: Path) -> Iterator[Any]:
    """An ordinary worker of the model (router-preprocessed pictures)."""
    server = start_server(qwen2_vl, "--enable-multimodal")
    try:
        server.wait_serving()
        with grpc.insecure_channel(server.address) as channel:
            yield pb_grpc.SglangSchedulerStub(channel)
    finally:
        code, alive = stop_tree(server)
        assert code == 0, server.tail()
        assert not alive


def preprocessed(model: Path, prompt: str, pictures: tuple[str, ...]) -> tuple[list[int], Any]:
    """What smg 1.13 sends an SGLang worker of a Qwen2-VL model with ``--mm-processing
    router``: the prompt with each picture's pad token expanded to its positions, the flattened
    patches (float32), ``image_grid_thw`` and ``patches_per_image`` (int64), a span per picture
    and the image token; from transformers' own Qwen2-VL image processor."""
    import io

    from PIL import Image
    from transformers import AutoImageProcessor

    processor = AutoImageProcessor.from_pretrained(str(model), backend="pil")
    images = [Image.open(io.BytesIO(picture(name))) for name in pictures]
    out = processor(images=images, return_tensors="np")
    pixels, grids = out["pixel_values"].astype("float32"), out["image_grid_thw"].astype("int64")
    pad = prompt_ids(model, IMAGE_ANCHOR)[1]
    ids: list[int] = []
    spans: list[pb.PlaceholderRange] = []
    grid_rows = iter(grids.tolist())
    for token in prompt_ids(model, prompt):
        if token != pad:
            ids.append(token)
            continue
        t, h, w = next(grid_rows)
        spans.append(pb.PlaceholderRange(offset=len(ids), length=t * h * w // 4))
        ids.extend([pad] * (t * h * w // 4))
    patches = grids.prod(axis=1).astype("int64")

    def tensor(array: Any) -> pb.TensorData:
        return pb.TensorData(data=array.tobytes(), shape=list(array.shape), dtype=str(array.dtype))

    mm = pb.MultimodalInputs(
        pixel_values=tensor(pixels), modalities=["image"], im_token_id=pad, mm_placeholders=spans,
    )  # fmt: skip
    mm.model_specific_tensors["image_grid_thw"].CopyFrom(tensor(grids))
    mm.model_specific_tensors["patches_per_image"].CopyFrom(tensor(patches))
    return ids, mm


@pytest.mark.parametrize("name", sorted(CASES))
def test_router_preprocessed_pictures_give_sglangs_own_ids(
    vision_stub: Any, qwen2_vl: Path, reference: dict[str, list[int]], name: str
) -> None:
    ids, mm = preprocessed(qwen2_vl, *CASES[name])
    message = pb.GenerateRequest(
        request_id=f"pre-{name}", tokenized=pb.TokenizedInput(input_ids=ids), mm_inputs=mm,
        sampling_params=pb.SamplingParams(temperature=0, max_new_tokens=MAX_TOKENS),
    )  # fmt: skip
    assert list(generate(vision_stub, message).output_ids) == reference[name]


def _tensor(mm: Any, name: str, data: bytes, shape: list[int], dtype: str) -> None:
    mm.model_specific_tensors[name].CopyFrom(pb.TensorData(data=data, shape=shape, dtype=dtype))


def _grid(rows: list[int]) -> Any:
    return lambda mm: _tensor(mm, "image_grid_thw", struct.pack("<3q", *rows), [1, 3], "int64")


def _patch_width(mm: Any) -> None:
    mm.pixel_values.shape[:] = [32, 588]


def _no_grid(mm: Any) -> None:
    del mm.model_specific_tensors["image_grid_thw"]


def _span_short(mm: Any) -> None:
    mm.mm_placeholders[0].length = 3


#: Broken router-preprocessed requests: how each breaks one, and the field the refusal names.
BAD_PATCHES: dict[str, tuple[Any, str]] = {
    "patch width": (_patch_width, "mm_inputs.pixel_values: shape [32, 588] is not [patches, 1176]"),
    "no grid": (_no_grid, "mm_inputs.model_specific_tensors['image_grid_thw'] is required"),
    "grid of other patches": (
        _grid([1, 4, 8]),
        "mm_inputs.pixel_values: 16 patches; the grids hold 32",
    ),
    "grid not of merges": (_grid([1, 3, 4]), "image_grid_thw'][0]: (1, 3, 4) is not a grid"),
    "patches per image": (
        lambda mm: _tensor(mm, "patches_per_image", struct.pack("<q", 8), [1], "int64"),
        "patches_per_image']: not each picture's patch count",
    ),
    "stray tensor": (
        lambda mm: _tensor(mm, "pixel_attention_mask", b"\0", [1], "uint8"),
        "model_specific_tensors['pixel_attention_mask']: not taken by this qwen2_vl model",
    ),
    "span short": (_span_short, "mm_placeholders[0]: length 3; this image fills 4 positions"),
}


@pytest.mark.parametrize("case", sorted(BAD_PATCHES))
def test_a_broken_router_preprocessed_picture_is_invalid_argument_naming_the_field(
    vision_stub: Any, qwen2_vl: Path, case: str
) -> None:
    ids, mm = preprocessed(qwen2_vl, *CASES["one"])
    breaks, field = BAD_PATCHES[case]
    breaks(mm)
    message = pb.GenerateRequest(
        request_id=f"bad-{case}", tokenized=pb.TokenizedInput(input_ids=ids), mm_inputs=mm,
        sampling_params=pb.SamplingParams(temperature=0, max_new_tokens=2),
    )  # fmt: skip
    with pytest.raises(grpc.RpcError) as err:
        generate(vision_stub, message)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT  # pyright: ignore[reportAttributeAccessIssue]
    assert field in (err.value.details() or "")  # pyright: ignore[reportAttributeAccessIssue]
    assert healthy(vision_stub)


def test_the_worker_says_it_takes_images(stub: Any) -> None:
    assert stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=10).supports_vision


@pytest.mark.parametrize("name", sorted(CASES))
def test_greedy_ids_equal_sglangs_own_for_the_same_pictures(
    stub: Any, qwen2_vl: Path, reference: dict[str, list[int]], name: str
) -> None:
    prompt, pictures = CASES[name]
    ids = prompt_ids(qwen2_vl, prompt)
    urls = [data_url(picture(p)) for p in pictures]
    complete = generate(stub, request(ids, urls, rid=f"lo-{name}"))
    assert list(complete.output_ids) == reference[name]
    # SGLang's scheduler expanded each picture's token into its positions.
    assert complete.prompt_tokens == len(ids) + len(pictures) * (POSITIONS - 1)


def test_the_picture_moves_the_answer(reference: dict[str, list[int]]) -> None:
    """``one`` and ``other`` differ in their picture only (the prompt is the same)."""
    assert CASES["one"][0] == CASES["other"][0]
    assert reference["one"] != reference["other"]


@pytest.mark.parametrize(
    ("case", "field"),
    [
        ("pixels", "mm_inputs.pixel_values: a language-only worker takes mm_inputs.image_urls"),
        ("bytes", "mm_inputs.image_data: a language-only worker takes mm_inputs.image_urls"),
        ("video", "mm_inputs: video and audio are not served"),
        ("none", "mm_inputs.image_urls is required"),
        ("file", "mm_inputs.image_urls[0]: a data: or http(s) URL"),
        ("one-token-short", "input_ids: 0 image token(s)"),
        ("expanded", "input_ids: two image tokens side by side"),
        ("n2", "n > 1 is not served with images"),
    ],
)
def test_a_bad_request_is_invalid_argument_naming_the_field(
    stub: Any, qwen2_vl: Path, case: str, field: str
) -> None:
    prompt, pictures = CASES["one"]
    ids = prompt_ids(qwen2_vl, prompt)
    url = data_url(picture(pictures[0]))
    pad = prompt_ids(qwen2_vl, IMAGE_ANCHOR)[1]
    message = request(ids, [url])
    if case == "pixels":
        pixels = pb.TensorData(data=b"\0" * 4, shape=[1], dtype="float32")
        message.mm_inputs.pixel_values.CopyFrom(pixels)
    elif case == "bytes":
        message.mm_inputs.image_data.append(b"\x89PNG")
    elif case == "video":
        message.mm_inputs.video_urls.append(url)
    elif case == "none":
        del message.mm_inputs.image_urls[:]
    elif case == "file":
        message.mm_inputs.image_urls[0] = "file:///etc/passwd"
    elif case == "one-token-short":
        message.tokenized.input_ids[:] = [t for t in ids if t != pad]
    elif case == "expanded":  # two pictures, their tokens side by side
        at = ids.index(pad)
        message.tokenized.input_ids[:] = [*ids[:at], pad, pad, *ids[at + 1 :]]
        message.mm_inputs.image_urls.append(url)
    elif case == "n2":
        message.sampling_params.n = 2
    with pytest.raises(grpc.RpcError) as err:
        generate(stub, message)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT  # pyright: ignore[reportAttributeAccessIssue]
    assert field in (err.value.details() or "")  # pyright: ignore[reportAttributeAccessIssue]
    assert healthy(stub)


def test_a_picture_the_encoder_cannot_read_ends_its_request_and_the_worker_serves_on(
    stub: Any, qwen2_vl: Path, reference: dict[str, list[int]]
) -> None:
    """The encoder's refusal reaches the waiting request (SGLang's ``EncoderDispatchErrorReq``,
    sent once the request is): a client fault, at once, not the scheduler's 180-second wait."""
    prompt, pictures = CASES["one"]
    ids = prompt_ids(qwen2_vl, prompt)
    started = time.monotonic()
    with pytest.raises(grpc.RpcError) as err:
        generate(stub, request(ids, ["data:image/png;base64,bm90IGEgcGljdHVyZQ=="], rid="bad"))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, err.value.details()  # pyright: ignore[reportAttributeAccessIssue]
    assert time.monotonic() - started < 60
    good = generate(stub, request(ids, [data_url(picture(pictures[0]))], rid="after-bad"))
    assert list(good.output_ids) == reference["one"]


def test_the_lanes_that_do_not_serve_it_refuse_it_at_start() -> None:
    """SGLang's ZMQ lane (and the Rust lane, which starts the same way) refuses
    ``--language-only`` in one line before any scheduler starts: the launchers exit 2 with what
    ``headless.unsupported`` says (their exit on it: ``test_headless.py``'s shapes)."""
    from smg_servicer_sglang import headless

    why = headless.unsupported(SimpleNamespace(enable_lora=False, language_only=True))
    assert why is not None
    assert why.startswith("--language-only (encoder disaggregation) is not served over SGLang's")


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"encoder_transfer_backend": "mooncake"}, "takes zmq_to_scheduler only"),
        ({"receiver_mode": "grpc"}, "takes the http receiver only"),
        ({"port_taken": True}, "the encoder bootstrap server cannot listen on port"),
    ],
    ids=["mooncake", "grpc-receiver", "port-taken"],
)
def test_what_the_worker_cannot_serve_is_a_configuration_error(
    change: dict[str, Any], why: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before the ranks start (the launcher exits 2 on a ``ValueError`` here)."""
    from smg_servicer_sglang import _sglang as sg

    if change.get("receiver_mode"):
        monkeypatch.setenv("SGLANG_ENCODER_MM_RECEIVER_MODE", change["receiver_mode"])
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1] if change.get("port_taken") else free_port()
        config = SimpleNamespace(
            language_only=True, host="127.0.0.1", encoder_bootstrap_port=port, encoder_urls=[],
            encoder_transfer_backend=change.get("encoder_transfer_backend", "zmq_to_scheduler"),
        )  # fmt: skip
        with pytest.raises(ValueError, match=why):
            sg.encoder_side(SimpleNamespace(), config)
    assert sg.encoder_side(SimpleNamespace(), SimpleNamespace(language_only=False)) is None


@pytest.mark.parametrize("processing", ["router", "worker"])
def test_the_router_cannot_send_this_worker_a_picture_yet(
    worker: Server, qwen2_vl: Path, processing: str
) -> None:
    """smg 1.13's Qwen-VL spec expects a ``<image>`` placeholder in the tokenizer (and a
    ``vision_token_id`` in the config), which Qwen2-VL checkpoints do not have: it answers an
    image chat with 400 itself, whether it preprocesses the picture or forwards it (it resolves
    the placeholder first, for any worker of the model). Text goes through. Pinned: the day a
    router sends the picture, this says so; the direct proofs above stand in for a routed one
    until then."""
    picture_part = {"type": "image_url", "image_url": {"url": data_url(picture("noise"))}}
    with Router(f"grpc://{worker.address}", "--mm-processing", processing) as router:
        chat = {"model": str(qwen2_vl), "max_tokens": 2, "temperature": 0}
        reply = httpx.post(
            router.base + "/v1/chat/completions", timeout=120,
            json=chat | {"messages": [{"role": "user", "content": [picture_part]}]},
        )  # fmt: skip
        assert reply.status_code == 400, reply.text
        assert "placeholder token '<image>' is missing" in reply.text
        text = httpx.post(
            router.base + "/v1/chat/completions", timeout=120,
            json=chat | {"messages": [{"role": "user", "content": "hello"}]},
        )  # fmt: skip
        assert text.status_code == 200, text.text


def test_without_its_encoder_a_request_fails_at_once(
    stub: Any, qwen2_vl: Path, encoder: Any, worker: Server
) -> None:
    """Last: the encoder is stopped. A picture's request fails at once (the dispatch error,
    not the scheduler's 180-second wait) and the worker stays up for text."""
    encoder.proc.terminate()
    encoder.proc.wait(timeout=30)
    prompt, pictures = CASES["one"]
    ids = prompt_ids(qwen2_vl, prompt)
    started = time.monotonic()
    with pytest.raises(grpc.RpcError) as err:
        generate(stub, request(ids, [data_url(picture(pictures[0]))], rid="no-encoder"))
    assert err.value.code() in (grpc.StatusCode.INTERNAL, grpc.StatusCode.UNAVAILABLE), (  # pyright: ignore[reportAttributeAccessIssue]
        err.value.details()  # pyright: ignore[reportAttributeAccessIssue]
    )
    assert time.monotonic() - started < 60
    text = pb.GenerateRequest(
        request_id="text", tokenized=pb.TokenizedInput(input_ids=ids[:3]),
        sampling_params=pb.SamplingParams(temperature=0, max_new_tokens=2),
    )  # fmt: skip
    assert len(generate(stub, text).output_ids) == 2
    assert worker.proc.poll() is None

"""The engine-free multimodal rules: settings parsing, media-ref checks, fetch-failure mapping,
the in-flight gate. No vLLM, no engine."""

from __future__ import annotations

import grpc
import pytest

from smg_servicer_core.errors import ConfigError, InvalidRequest, ServicerError, Unavailable
from smg_servicer_core.proto import common_pb2
from smg_servicer_core.proto import vllm_engine_pb2 as pb
from smg_servicer_vllm.mm import (
    MediaItem,
    MmGate,
    check_anchors,
    fetch_error,
    format_limits,
    item_limits,
    media_items,
)
from smg_servicer_vllm.mm_settings import (
    MmSettings,
    parse_item_limits,
    redact_url,
    resolve_mm_settings,
)

pytestmark = pytest.mark.unit

IMAGE, VIDEO = 10, 11
ON = MmSettings(processor="inprocess", max_item_bytes=300)


def request(ids: list[int], *refs: tuple[int, str]) -> pb.GenerateRequest:
    message = pb.GenerateRequest(request_id="r", tokenized=pb.TokenizedInput(input_ids=ids))
    for modality, url in refs:
        message.media_refs.items.add(modality=modality, url=url)
    return message


def check(message: pb.GenerateRequest, settings: MmSettings = ON) -> list[MediaItem]:
    return media_items(
        message,
        settings,
        limits={"image": 2, "video": 1},
        schemes=("http", "https", "data"),
        anchors={"image": IMAGE, "video": VIDEO},
    )


def test_valid_refs_come_back_in_order() -> None:
    items = check(
        request(
            [1, IMAGE, 2, VIDEO],
            (common_pb2.IMAGE, "http://h/a.png"),
            (common_pb2.VIDEO, " data:v;base64,AAAA "),
        )
    )
    assert items == [MediaItem("image", "http://h/a.png"), MediaItem("video", "data:v;base64,AAAA")]


@pytest.mark.parametrize(
    ("message", "text"),
    [
        (request([IMAGE]), "media_refs has no items"),
        (
            request([IMAGE], (common_pb2.IMAGE, "file:///x.png")),
            "file: URLs need --allowed-local-media-path",
        ),
        (request([IMAGE], (common_pb2.IMAGE, "ftp://x")), "scheme 'ftp' is not accepted"),
        (request([IMAGE], (common_pb2.IMAGE, "no-scheme")), "scheme '(none)'"),
        (
            request([IMAGE], (common_pb2.IMAGE, "data:i;base64," + "A" * 404)),
            "about 303 bytes, over the 300-byte limit",
        ),
        (
            request([IMAGE, IMAGE, IMAGE], *[(common_pb2.IMAGE, "http://h/a")] * 3),
            "more than 2 image item(s)",
        ),
        (
            request([IMAGE], (common_pb2.AUDIO, "http://h/a")),
            "this model does not accept audio input",
        ),
        (
            request([IMAGE, IMAGE], (common_pb2.IMAGE, "http://h/a")),
            "2 image anchor(s) (token 10) for 1",
        ),
        (
            request(
                [VIDEO, IMAGE], (common_pb2.IMAGE, "http://h/a"), (common_pb2.VIDEO, "http://h/v")
            ),
            "not in the order of media_refs.items",
        ),
        (request([IMAGE], (99, "http://h/a")), "modality 99 is not supported"),
    ],
)
def test_each_client_fault_is_invalid_argument(message: pb.GenerateRequest, text: str) -> None:
    with pytest.raises(InvalidRequest, match=None) as info:
        check(message)
    assert text in str(info.value)


def test_refs_need_tokenized_input_processing_on_and_no_tensors() -> None:
    text = pb.GenerateRequest(request_id="r", text="hi")
    text.media_refs.items.add(modality=common_pb2.IMAGE, url="http://h/a")
    with pytest.raises(InvalidRequest, match="need tokenized input"):
        check(text)
    with pytest.raises(InvalidRequest, match=r"--mm-processor \(SMG_VLLM_MM_PROCESSOR\) is off"):
        check(request([IMAGE], (common_pb2.IMAGE, "http://h/a")), MmSettings())
    both = request([IMAGE], (common_pb2.IMAGE, "http://h/a"))
    both.mm_inputs.im_token_id = IMAGE
    with pytest.raises(InvalidRequest, match="mutually exclusive"):
        check(both)


def test_anchors_of_models_without_a_declared_token_are_not_counted() -> None:
    check_anchors([1, 2, 3], [MediaItem("audio", "http://h/a")], {"image": IMAGE})


class ClientResponseError(Exception):
    def __init__(self, status: int) -> None:
        self.status = status


class ClientError(Exception): ...


class ClientConnectorError(ClientError, OSError): ...


class UnidentifiedImageError(OSError): ...


class VLLMClientError(Exception): ...


@pytest.mark.parametrize(
    ("exc", "code", "text"),
    [
        (ClientResponseError(404), grpc.StatusCode.INVALID_ARGUMENT, "answered HTTP 404"),
        (ClientResponseError(503), grpc.StatusCode.UNAVAILABLE, "answered HTTP 503"),
        (ClientResponseError(429), grpc.StatusCode.UNAVAILABLE, "answered HTTP 429"),
        (
            VLLMClientError("Failed to fetch media from URL: HTTP 410 error"),
            grpc.StatusCode.INVALID_ARGUMENT,
            "HTTP 410",
        ),
        (TimeoutError(), grpc.StatusCode.UNAVAILABLE, "timed out"),
        (ClientConnectorError(), grpc.StatusCode.UNAVAILABLE, "could not be reached"),
        (NotImplementedError(), grpc.StatusCode.INVALID_ARGUMENT, "only base64"),
        (FileNotFoundError("/secret/path"), grpc.StatusCode.INVALID_ARGUMENT, "does not exist"),
        (
            ValueError("The URL must be from one of the allowed domains: ['a']"),
            grpc.StatusCode.INVALID_ARGUMENT,
            "not in --allowed-media-domains",
        ),
        (
            ValueError("must be a subpath of `--allowed-local-media-path /srv`"),
            grpc.StatusCode.INVALID_ARGUMENT,
            "outside --allowed-local-media-path",
        ),
        (
            UnidentifiedImageError("cannot identify /tmp/x"),
            grpc.StatusCode.INVALID_ARGUMENT,
            "could not be read as image",
        ),
        (KeyError("x"), grpc.StatusCode.UNAVAILABLE, "could not be fetched"),
    ],
)
def test_fetch_failures_map_by_class_and_never_echo_the_exception(
    exc: BaseException, code: grpc.StatusCode, text: str
) -> None:
    mapped = fetch_error(exc, "media_refs.items[0]", "image")
    assert isinstance(mapped, ServicerError) and mapped.code == code
    assert text in str(mapped) and "/secret" not in str(mapped) and "/tmp/x" not in str(mapped)


def test_the_gate_refuses_instead_of_queueing() -> None:
    gate = MmGate(1)
    with gate.slot(), pytest.raises(Unavailable, match="worker is saturated"), gate.slot():
        pass
    with gate.slot():
        assert gate.active == 1
    assert gate.active == 0


def test_item_limits_and_their_label() -> None:
    limits = item_limits({"image": 2, "video": 999}, {"image": 5, "audio": 3})
    assert limits == {"image": 5, "video": 999}
    assert format_limits(limits) == "image=5,video=999"
    assert parse_item_limits("4") == {"image": 4, "video": 4, "audio": 4}
    assert parse_item_limits(" image=1 , video=0") == {"image": 1, "video": 0}
    for bad in ("image", "image=1,image=2", "pixels=3", "-1"):
        with pytest.raises(ValueError, match=r"expected|twice"):
            parse_item_limits(bad)


def test_redaction_hides_credentials_only() -> None:
    assert redact_url("redis://user:pw@[::1]:6380/0") == "redis://user:***@[::1]:6380/0"
    assert redact_url("rediss://alice:p%40ss@h:6380/2") == "rediss://alice:***@h:6380/2"
    assert redact_url("redis://:pw@h/0") == "redis://:***@h/0"
    assert redact_url("redis://alice@h/0") == "redis://alice@h/0"  # no password: nothing hidden
    assert redact_url("redis://u:pw@h:port/0") == "<an unreadable URL>"
    assert redact_url("redis://127.0.0.1:6379/0") == "redis://127.0.0.1:6379/0"


def test_resolution_records_sources_and_refuses_bad_values() -> None:
    settings = resolve_mm_settings(None, {"SMG_VLLM_MM_MAX_INFLIGHT": "4"})
    assert (settings.processor, settings.source, settings.max_inflight) == ("off", "default", 4)
    assert settings.sources["max_inflight"] == "env"
    with pytest.raises(ConfigError, match="SMG_VLLM_MM_SIDECAR_NAMESPACE"):
        resolve_mm_settings(None, {"SMG_VLLM_MM_SIDECAR_NAMESPACE": "has space"})
    with pytest.raises(ValueError, match="max_inflight"):
        MmSettings(max_inflight=0)

"""vLLM's KV-transfer connector on a prefill/decode worker (issue #25 D4): the connector
GetServerInfo reports (a ``MultiConnector`` by the child that moves the KV, which the router's
pairing protocol keys on), and the rejection notice a request with ``do_remote_prefill`` owes
the connector when it fails before vLLM took it (withheld with Mooncake at any depth)."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace
from typing import Any

import grpc
import pytest

from smg_servicer_core.proto import vllm_engine_pb2 as pb
from smg_servicer_vllm import kv_transfer
from smg_servicer_vllm.testing import FakeAsyncLLM

NIXL = {"kv_connector": "NixlConnector", "kv_role": "kv_both"}
MOONCAKE = {"kv_connector": "MooncakeConnector", "kv_role": "kv_both"}
LMCACHE = {"kv_connector": "LMCacheConnectorV1", "kv_role": "kv_both"}
OFFLOAD = {"kv_connector": "OffloadingConnector", "kv_role": "kv_both"}


def multi(*children: dict[str, Any]) -> dict[str, Any]:
    return {
        "kv_connector": "MultiConnector",
        "kv_role": "kv_both",
        "kv_connector_extra_config": {"connectors": list(children)},
    }


@pytest.mark.unit
@pytest.mark.parametrize(
    ("config", "reported", "mooncake"),
    [
        (None, "", False),
        (NIXL, "NixlConnector", False),
        (MOONCAKE, "MooncakeConnector", False),
        (OFFLOAD, "OffloadingConnector", False),
        (multi(LMCACHE, NIXL), "NixlConnector", False),
        (multi(OFFLOAD, multi(LMCACHE, MOONCAKE)), "MooncakeConnector", True),
        (multi(OFFLOAD, LMCACHE), "MultiConnector", False),
        (multi(), "MultiConnector", False),
    ],
)
def test_the_reported_connector_and_mooncake_at_any_depth(
    config: Any, reported: str, mooncake: bool
) -> None:
    for shape in (config, _namespace(config)):
        assert kv_transfer.reported_connector(shape) == reported
        assert kv_transfer.runs_mooncake(shape) == (mooncake or reported == "MooncakeConnector")


def _namespace(config: Any) -> Any:
    """vLLM's ``KVTransferConfig`` shape (attributes; its children stay dicts)."""
    return None if config is None else SimpleNamespace(**config)


@pytest.mark.unit
def test_nesting_deeper_than_the_bound_is_not_read() -> None:
    config: dict[str, Any] = MOONCAKE
    for _ in range(kv_transfer.MAX_DEPTH + 1):
        config = multi(config)
    assert not kv_transfer.runs_mooncake(config)
    assert kv_transfer.runs_mooncake(multi(multi(MOONCAKE)))


@pytest.mark.unit
@pytest.mark.parametrize(
    ("config", "params", "owed"),
    [
        (NIXL, {"do_remote_prefill": True, "remote_engine_id": "p"}, True),
        (multi(LMCACHE, NIXL), {"do_remote_prefill": True}, True),
        (NIXL, {"do_remote_decode": True}, False),  # a prefill leg pins nothing remote
        (NIXL, None, False),
        (None, {"do_remote_prefill": True}, False),  # no connector to tell
        (MOONCAKE, {"do_remote_prefill": True}, False),  # withheld: it kills vLLM 0.31's decode
        (multi(NIXL, multi(MOONCAKE)), {"do_remote_prefill": True}, False),
    ],
)
def test_who_is_owed_a_rejection_notice(config: Any, params: Any, owed: bool) -> None:
    assert kv_transfer.owes_rejection_notice(config, params) is owed


def _request(rid: str, params: dict[str, Any] | None, **sampling: Any) -> pb.GenerateRequest:
    request = pb.GenerateRequest(
        request_id=rid,
        tokenized=pb.TokenizedInput(input_ids=[1, 2, 3]),
        sampling_params=pb.SamplingParams(max_tokens=4, **sampling),
    )
    if params is not None:
        request.kv_transfer_params_json = json.dumps(params)
    return request


async def _status(stub: Any, request: pb.GenerateRequest) -> grpc.StatusCode:
    try:
        async for _ in stub.Generate(request):
            pass
    except grpc.aio.AioRpcError as exc:
        return exc.code()
    return grpc.StatusCode.OK


async def _until(predicate: Any, limit_s: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + limit_s
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline
        await asyncio.sleep(0.01)


REMOTE_PREFILL = {"do_remote_prefill": True, "remote_engine_id": "prefill-0", "remote_port": 5600}


@pytest.mark.contract
@pytest.mark.asyncio(loop_scope="session")
async def test_a_request_refused_before_the_engine_took_it_is_reported_to_the_connector(
    serve_llm: Any,
) -> None:
    llm = FakeAsyncLLM()
    llm.vllm_config.kv_transfer_config = SimpleNamespace(**multi(LMCACHE, NIXL))
    async with serve_llm(llm) as (_, stub):
        info = await stub.GetServerInfo(pb.GetServerInfoRequest())
        assert info.kv_connector == "NixlConnector"  # the router's pairing protocol
        # refused here (an unknown constraint value) and refused by vLLM on arrival
        bad = _request("refused-here", REMOTE_PREFILL, temperature=-1.0)
        assert await _status(stub, bad) == grpc.StatusCode.INVALID_ARGUMENT
        llm.raise_after = (0, ValueError("max_tokens too large for this model"))
        pinned = _request("refused-by-vllm", REMOTE_PREFILL)
        pinned.data_parallel_rank = 0
        assert await _status(stub, pinned) == grpc.StatusCode.INVALID_ARGUMENT
        llm.raise_after = None
        await _until(lambda: len(llm.rejected) == 2)
        assert llm.rejected == [
            ("refused-here", REMOTE_PREFILL, None),
            ("refused-by-vllm", REMOTE_PREFILL, 0),
        ]
        # served, a prefill leg, or no remote prefill: nothing to report
        assert await _status(stub, _request("served", REMOTE_PREFILL)) == grpc.StatusCode.OK
        leg = _request("prefill-leg", {"do_remote_decode": True}, temperature=-1.0)
        assert await _status(stub, leg) == grpc.StatusCode.INVALID_ARGUMENT
        await asyncio.sleep(0.2)
        assert [r[0] for r in llm.rejected] == ["refused-here", "refused-by-vllm"]


@pytest.mark.contract
@pytest.mark.asyncio(loop_scope="session")
async def test_no_notice_with_mooncake_anywhere(serve_llm: Any) -> None:
    llm = FakeAsyncLLM()
    llm.vllm_config.kv_transfer_config = SimpleNamespace(**multi(NIXL, multi(MOONCAKE)))
    async with serve_llm(llm) as (_, stub):
        bad = _request("refused", REMOTE_PREFILL, temperature=-1.0)
        assert await _status(stub, bad) == grpc.StatusCode.INVALID_ARGUMENT
        await asyncio.sleep(0.2)
    assert llm.rejected == []

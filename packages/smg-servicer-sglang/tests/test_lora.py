"""LoRA adapters on the real SGLang scheduler (CPU, torch-native LoRA backend), over gRPC.

One worker: ``sglang serve --smg-grpc-mode --enable-lora --lora-paths a=DIR`` with run-time loads
allowed from one folder. Greedy ids with an adapter equal ``sglang.Engine``'s own generation with
that adapter (:mod:`smg_it.sglang_reference`, ``--lora``) and differ from the base model's; two
adapters and the base model in one batch each get their own. Loads and unloads drive SGLang's own
adapter manager; bad loads, paths out of the allowed folder and unknown adapters are refused
with the documented code and the worker stays healthy (the fuzz at the end draws them).

The adapters are the tiny model's (``smg_servicer_core.testing.tiny_lora``, PEFT's format,
float32). SGLang's CPU build asks for pinned memory in its LoRA layers: the workers and the
reference run with the test environment's pin-memory shim (``tools/envs/sglang-cpu/shims``).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import pytest
import pytest_asyncio
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

from smg_it import dashboard
from smg_it.harness import free_port
from smg_it.paths import model_cache
from smg_it.sglang_reference import LORA_PROMPT, MAX_TOKENS
from smg_it.sglang_suite import Server, run_reference, start_server
from smg_servicer_core.proto import sglang_scheduler_pb2 as pb
from smg_servicer_core.proto import sglang_scheduler_pb2_grpc as pb_grpc
from smg_servicer_core.testing.metrics import family_names, scrape, value
from smg_servicer_core.testing.tiny_lora import TinyLoraSpec, cached_tiny_lora, make_tiny_lora
from smg_servicer_sglang.testing import LORA_CPU_FLAGS, PIN_MEMORY_SHIM_ENV

pytestmark = [pytest.mark.engine, pytest.mark.asyncio(loop_scope="session")]

CODE = grpc.StatusCode
#: What a caller may get for a fuzzed LoRA call: its own fault, never the worker's.
CLIENT_FAULT = {
    CODE.INVALID_ARGUMENT, CODE.NOT_FOUND, CODE.ALREADY_EXISTS, CODE.PERMISSION_DENIED,
    CODE.FAILED_PRECONDITION,
}  # fmt: skip


def adapter(seed_: int, **spec: Any) -> Path:
    return cached_tiny_lora(model_cache(), TinyLoraSpec(seed=seed_, **spec))


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The allowed folder (adapters b and c, and bad ones) and a folder outside it."""
    root = tmp_path_factory.mktemp("lora")
    allowed, outside = root / "allowed", root / "outside"
    allowed.mkdir()
    outside.mkdir()
    for name, seed_ in (("b", 2), ("c", 3)):
        shutil.copytree(adapter(seed_), allowed / name)
    shutil.copytree(adapter(4), outside / "d")
    (allowed / "empty").mkdir()
    (allowed / "a-file").write_text("not an adapter\n")
    make_tiny_lora(allowed / "rank16", TinyLoraSpec(seed=5, rank=16))
    make_tiny_lora(allowed / "mlp", TinyLoraSpec(seed=6, targets=("gate_proj",)))
    shutil.copytree(adapter(2), allowed / "bad-json")
    (allowed / "bad-json" / "adapter_config.json").write_text("{")
    shutil.copytree(adapter(2), allowed / "bad-weights")
    (allowed / "bad-weights" / "adapter_model.safetensors").write_bytes(b"\x00" * 64)
    (allowed / "link-out").symlink_to(outside / "d")
    shutil.copytree(adapter(2), allowed / "config-out")
    (allowed / "config-out" / "adapter_config.json").unlink()
    (allowed / "config-out" / "adapter_config.json").symlink_to(
        outside / "d" / "adapter_config.json"
    )
    return {"allowed": allowed, "outside": outside}


@pytest.fixture(scope="module")
def lora_worker(
    tiny_model: Path, folders: dict[str, Path]
) -> Iterator[tuple[Server, dict[str, list[Any]]]]:
    """The LoRA worker, and ``sglang.Engine``'s greedy ids for the base model and adapters a, b
    (alone and batched), computed while the worker starts."""
    metrics_port = free_port()
    env = PIN_MEMORY_SHIM_ENV | {
        "SMG_SGLANG_SERVICER_LORA_ALLOWED_DIRS": str(folders["allowed"]),
        "SMG_SGLANG_SERVICER_METRICS_PORT": str(metrics_port),
    }
    server = start_server(tiny_model, *LORA_CPU_FLAGS, "--lora-paths", f"a={adapter(1)}", env=env)
    server.metrics_port = metrics_port
    try:
        pairs = [f"a={adapter(1)}", f"b={adapter(2)}"]
        reference = run_reference(tiny_model, "--lora", *pairs, env=PIN_MEMORY_SHIM_ENV)
        server.wait_serving()
        yield server, reference
    finally:
        assert server.stop() == 0, server.tail()


@pytest.fixture(scope="module")
def lora_server(lora_worker: tuple[Server, dict[str, list[Any]]]) -> Server:
    return lora_worker[0]


@pytest.fixture(scope="module")
def reference(lora_worker: tuple[Server, dict[str, list[Any]]]) -> dict[str, list[Any]]:
    return lora_worker[1]


@pytest_asyncio.fixture(loop_scope="session", scope="module")
async def stub(lora_server: Server) -> AsyncIterator[pb_grpc.SglangSchedulerStub]:
    async with grpc.aio.insecure_channel(lora_server.address) as channel:
        yield pb_grpc.SglangSchedulerStub(channel)


_ids = iter(range(1_000_000))


def request(lora_id: str = "", max_tokens: int = MAX_TOKENS, **kwargs: Any) -> pb.GenerateRequest:
    return pb.GenerateRequest(
        request_id=f"lora-{next(_ids)}",
        tokenized=pb.TokenizedInput(input_ids=LORA_PROMPT),
        sampling_params=pb.SamplingParams(
            temperature=0.0, max_new_tokens=max_tokens, ignore_eos=max_tokens > MAX_TOKENS
        ),
        lora_id=lora_id,
        **kwargs,
    )


async def greedy(stub: Any, lora_id: str = "") -> list[int]:
    replies = [r async for r in stub.Generate(request(lora_id))]
    return list(replies[-1].complete.output_ids)


async def refused(call: Any) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        result = call()
        if hasattr(result, "__aiter__"):
            async for _ in result:
                pass
        else:
            await result
    return err.value.code(), err.value.details() or ""


async def loaded(stub: Any) -> dict[str, pb.LoadedLoRAAdapter]:
    reply = await stub.ListLoadedLoRAAdapters(pb.ListLoadedLoRAAdaptersRequest())
    return {a.lora_name: a for a in reply.loaded_adapters}


async def assert_healthy(stub: Any, server: Server) -> None:
    assert (await stub.HealthCheck(pb.HealthCheckRequest(), timeout=30)).healthy
    assert server.proc is not None and server.proc.poll() is None
    assert not [c for c in server.children() if c.status() == "zombie"]


async def load(stub: Any, name: str, path: Path | str, lora_id: str = "") -> Any:
    return await stub.LoadLoRAAdapter(
        pb.LoadLoRAAdapterRequest(lora_name=name, lora_path=str(path), lora_id=lora_id)
    )


# -- serving ---------------------------------------------------------------------------------


async def test_a_start_up_adapter_by_name_and_by_id_gives_sglangs_own_ids(
    stub: Any, reference: dict[str, Any]
) -> None:
    adapters = await loaded(stub)
    assert adapters["a"].lora_path == str(adapter(1))
    assert adapters["a"].lora_id  # SGLang's own id for a --lora-paths adapter
    assert await greedy(stub) == reference["base"]
    assert await greedy(stub, "a") == reference["a"]
    assert await greedy(stub, adapters["a"].lora_id) == reference["a"]
    assert reference["a"] != reference["base"]


async def test_a_run_time_load_serves_the_adapter_and_every_answer_tells_the_engines_truth(
    stub: Any, reference: dict[str, Any], folders: dict[str, Path]
) -> None:
    reply = await load(stub, "b", folders["allowed"] / "b", lora_id="b-1")
    adapters = await loaded(stub)
    assert set(reply.loaded_lora_ids) == {adapters["a"].lora_id, "b-1"}
    assert adapters["b"].lora_id == "b-1"
    assert adapters["b"].lora_path == str(folders["allowed"] / "b")
    assert await greedy(stub, "b-1") == reference["b"]
    assert await greedy(stub, "b") == reference["b"]
    assert reference["b"] not in (reference["a"], reference["base"])


async def test_two_adapters_and_the_base_model_in_one_batch_each_get_their_own(
    stub: Any, reference: dict[str, Any]
) -> None:
    assert "b" in await loaded(stub)
    got = await asyncio.gather(*(greedy(stub, key) for key in ("", "a", "b") * 2))
    assert got == [reference["base"], reference["a"], reference["b"]] * 2
    assert reference["batch"] == [reference["base"], reference["a"], reference["b"]]


# -- refusals --------------------------------------------------------------------------------


async def test_an_adapter_that_is_not_loaded_is_refused_naming_it(
    stub: Any, lora_server: Server
) -> None:
    code, details = await refused(lambda: stub.Generate(request("nope-7")))
    assert code == CODE.INVALID_ARGUMENT
    assert "'nope-7'" in details and "no loaded adapter" in details
    await assert_healthy(stub, lora_server)


BAD_LOADS = {
    # name: (the path under the allowed folder, or an absolute one; code; words of the message)
    "outside": ("{outside}/d", CODE.PERMISSION_DENIED, "outside the folders"),
    "etc": ("/etc", CODE.PERMISSION_DENIED, "outside the folders"),
    "dotdot": ("{allowed}/../outside/d", CODE.INVALID_ARGUMENT, "'..'"),
    "relative": ("allowed/b", CODE.INVALID_ARGUMENT, "not an absolute path"),
    "link-out": ("{allowed}/link-out", CODE.PERMISSION_DENIED, "outside the folders"),
    "config-out": ("{allowed}/config-out", CODE.PERMISSION_DENIED, "outside the allowed"),
    "missing": ("{allowed}/missing", CODE.NOT_FOUND, "no adapter folder"),
    "empty": ("{allowed}/empty", CODE.INVALID_ARGUMENT, "not an adapter folder"),
    "a-file": ("{allowed}/a-file", CODE.NOT_FOUND, "no adapter folder"),
    "bad-json": ("{allowed}/bad-json", CODE.INVALID_ARGUMENT, "not a readable JSON"),
    "rank16": ("{allowed}/rank16", CODE.INVALID_ARGUMENT, "rank 16"),
    "bad-weights": ("{allowed}/bad-weights", CODE.INVALID_ARGUMENT, "could not load adapter"),
    # A module the worker's --lora-target-modules leave out: SGLang's own check refuses it.
    "mlp": ("{allowed}/mlp", CODE.INVALID_ARGUMENT, "could not load adapter"),
}


@pytest.mark.parametrize("case", sorted(BAD_LOADS))
async def test_a_bad_load_is_refused_with_its_code_and_the_worker_stays_healthy(
    stub: Any, lora_server: Server, folders: dict[str, Path], case: str
) -> None:
    path, code, words = BAD_LOADS[case]
    before = await loaded(stub)
    got = await refused(lambda: load(stub, f"x-{case}", path.format(**folders)))
    assert got[0] == code and words in got[1], got
    if "{outside}" not in path and ".." not in path:
        assert str(folders["outside"]) not in got[1]  # where a link leads is not told
    assert await loaded(stub) == before
    await assert_healthy(stub, lora_server)


async def test_a_name_or_id_already_loaded_is_refused(stub: Any, folders: dict[str, Path]) -> None:
    assert (await refused(lambda: load(stub, "a", folders["allowed"] / "c")))[0] == (
        CODE.ALREADY_EXISTS
    )
    assert (await refused(lambda: load(stub, "c2", folders["allowed"] / "c", "b-1")))[0] == (
        CODE.ALREADY_EXISTS
    )
    code, _ = await refused(
        lambda: stub.UnloadLoRAAdapter(pb.UnloadLoRAAdapterRequest(lora_name="never"))
    )
    assert code == CODE.NOT_FOUND


# -- unload while in use ----------------------------------------------------------------------


async def test_unload_waits_for_the_request_using_the_adapter_and_refuses_new_ones(
    stub: Any, lora_server: Server, folders: dict[str, Path]
) -> None:
    """SGLang's order: the adapter leaves the registry at once (new requests naming it are
    refused), the ranks unload it when the request using it has ended; that request ends
    whole."""
    await load(stub, "c", folders["allowed"] / "c")
    call = stub.Generate(request("c", max_tokens=300, stream=True))
    first = await call.read()
    assert first.WhichOneof("response") == "chunk"
    unload = asyncio.ensure_future(
        stub.UnloadLoRAAdapter(pb.UnloadLoRAAdapterRequest(lora_name="c"))
    )
    deadline = time.monotonic() + 30
    while "c" in await loaded(stub):
        assert time.monotonic() < deadline, "the adapter never left the list"
        await asyncio.sleep(0.02)
    code, details = await refused(lambda: stub.Generate(request("c")))
    assert code == CODE.INVALID_ARGUMENT and "'c'" in details
    code, details = await refused(lambda: load(stub, "c", folders["allowed"] / "c"))
    assert code == CODE.FAILED_PRECONDITION and "being unloaded" in details
    assert not unload.done()
    rest = []
    while (message := await call.read()) is not grpc.aio.EOF:
        rest.append(message)
    ended = time.monotonic()
    assert rest[-1].complete.finish_reason == "length"
    assert len(first.chunk.token_ids) + sum(len(m.chunk.token_ids) for m in rest) == 300
    reply = await unload
    assert time.monotonic() >= ended
    assert "c" not in await loaded(stub) and len(reply.loaded_lora_ids) == len(await loaded(stub))
    await assert_healthy(stub, lora_server)
    await load(stub, "c", folders["allowed"] / "c")  # and it loads again


async def test_metrics_count_adapters_and_updates(stub: Any, lora_server: Server) -> None:
    assert lora_server.metrics_port is not None
    samples = await asyncio.to_thread(scrape, lora_server.metrics_port)
    assert value(samples, "smg_servicer_lora_adapters_loaded") == len(await loaded(stub))
    assert value(samples, "smg_servicer_lora_updates_total", op="load", outcome="ok") >= 3
    assert value(samples, "smg_servicer_lora_updates_total", op="load", outcome="refused") >= len(
        BAD_LOADS
    )
    assert value(samples, "smg_servicer_lora_updates_total", op="unload", outcome="ok") >= 1


async def test_the_dashboards_lora_row_is_what_a_lora_worker_exports(lora_server: Server) -> None:
    """``dashboards/smg-servicer.json``'s LoRA row (shown for SGLang with LoRA on) queries
    families this worker exports; tests-integration/test_router.py checks the other rows."""
    assert lora_server.metrics_port is not None
    wanted = dashboard.queried_metrics(features=frozenset({"lora"}))["sglang"]
    families = await asyncio.to_thread(family_names, lora_server.metrics_port)
    lora = {m for m in wanted if "lora" in m}
    assert len(lora) == 2 and all(dashboard.exported(m, families) for m in lora), (lora, families)


# -- fuzz --------------------------------------------------------------------------------------

FUZZ_EXAMPLES = int(os.environ.get("SMG_LORA_FUZZ_EXAMPLES", "60"))
_NAMES = st.one_of(
    st.sampled_from(["a", "b", "b-1", "c", "", " ", "\x00", "../a", "x" * 300, "a:b", "é", "/"]),
    st.text(max_size=12),
)


def _paths(folders: dict[str, Path]) -> st.SearchStrategy[str]:
    allowed, outside = str(folders["allowed"]), str(folders["outside"])
    return st.one_of(
        st.sampled_from(
            [f"{allowed}/{n}" for n in BAD_LOADS if n not in ("outside", "etc", "relative")]
            + [allowed, f"{allowed}/", f"{allowed}/b", f"{allowed}//b/.", f"{outside}/d",
               "/", "/proc/self", "/dev/zero", "", "\x00", "~/b", f"{allowed}/b\x00x",
               "../" * 30, "x" * 5000, f"{allowed}/../../../etc"]
        ),
        st.text(max_size=24).map(lambda t: f"{allowed}/{t}"),
    )  # fmt: skip


async def test_fuzzed_adapter_calls_get_ok_or_a_client_fault_and_the_engine_lives(
    stub: Any, lora_server: Server, folders: dict[str, Path], reference: dict[str, Any]
) -> None:
    """Load, Unload and Generate with drawn names, ids and paths: each answer is OK or the
    caller's fault with a message, never INTERNAL/UNKNOWN, and the scheduler never dies."""
    loop = asyncio.get_running_loop()
    seen: list[str] = []

    async def one(op: str, name: str, path: str) -> tuple[grpc.StatusCode, str]:
        try:
            if op == "load":
                await load(stub, name, path, lora_id=name[::-1])
            elif op == "unload":
                await stub.UnloadLoRAAdapter(pb.UnloadLoRAAdapterRequest(lora_name=name))
            else:
                await greedy(stub, name)
        except grpc.aio.AioRpcError as err:
            return err.code(), err.details() or ""
        return CODE.OK, ""

    @seed(20261206)
    @settings(max_examples=FUZZ_EXAMPLES, database=None, deadline=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])  # fmt: skip
    @given(op=st.sampled_from(["load", "unload", "generate"]), name=_NAMES,
           path=_paths(folders))  # fmt: skip
    def check(op: str, name: str, path: str) -> None:
        if op == "unload" and name == "a":
            return  # the start-up adapter stays: the last check replays it
        code, details = asyncio.run_coroutine_threadsafe(one(op, name, path), loop).result(120)
        seen.append(code.name)
        assert code == CODE.OK or (code in CLIENT_FAULT and details), (op, name, path, code)

    await asyncio.to_thread(check)
    assert {"OK", "INVALID_ARGUMENT"} <= set(seen), json.dumps(sorted(set(seen)))
    await assert_healthy(stub, lora_server)
    assert await greedy(stub, "a") == reference["a"]

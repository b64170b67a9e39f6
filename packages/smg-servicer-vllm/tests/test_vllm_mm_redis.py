"""``--mm-processor redis`` on the real vLLM CPU engine (tiny float32 Idefics3) with a real
``redis-server`` and the real sidecar process (``python -m smg_grpc_servicer.vllm.mm_sidecar``):
greedy ids equal the in-process path's and vLLM's own; the faults an operator meets (Redis killed
and restarted, the sidecar killed, a fingerprint that disagrees, a forged result, a deep queue, a
result over the cap, a job past its deadline) each end the way the protocol says.

Redis speaks TLS only, with an ACL user (``rediss://smg-mm:<password>@127.0.0.1:<port>/0``, its
``default`` user off; certificates made here), so every test runs over the link an operator
should deploy; a wrong password or CA stops the worker and the sidecar at start (exit 2, one
line), and the password shows in no log."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import msgspec
import pytest
import pytest_asyncio

from smg_servicer_core.config import environment
from smg_servicer_core.proto import vllm_engine_pb2 as pb
from smg_servicer_core.testing.certs import CA, make_ca
from smg_servicer_core.testing.media import MediaServer, data_url, png_image
from smg_servicer_core.testing.redis_server import RedisServer, RedisTlsFiles
from smg_servicer_mm_sidecar import protocol as p
from smg_servicer_mm_sidecar.client import RedisTls, connect
from smg_servicer_vllm.mm_settings import MmSettings
from smg_servicer_vllm.testing.multimodal import complete, media_request, reference, vlm_prompts
from smg_servicer_vllm.testing.sidecar import SidecarProcess, sidecar_args

pytestmark = [pytest.mark.engine, pytest.mark.asyncio(loop_scope="session")]

USER, PASSWORD = "smg-mm", "pa55-w0rd-xyz"
#: The workers' sidecar deadline: far above a healthy job (0.1-0.5 s) so that a busy machine
#: never turns a slow job into sidecar_timeout. "Fails fast" checks bound at FAST_S, far below it;
#: the one test of the deadline itself runs a worker of its own with SHORT_TIMEOUT_MS.
TIMEOUT_MS = 30_000
SHORT_TIMEOUT_MS = 4000
FAST_S = 10.0
#: How long the worker may take to see a hello appear or go (healthy: one GetServerInfo, 0.2 s).
ADVERTISED_S = 30.0
#: The worker's --mm-sidecar-max-queue: jobs waiting in Redis beyond it are refused.
MAX_QUEUE = 4
IMAGE_A = png_image(40, 50, seed=1)
IMAGE_B = png_image(64, 30, seed=2)


@pytest.fixture(scope="module")
def ids(tiny_vlm: Path) -> dict[str, Any]:
    return vlm_prompts(tiny_vlm)


@pytest.fixture(scope="module")
def cas(tmp_path_factory: Any) -> dict[str, CA]:
    """``ours`` signed Redis's certificate; ``other`` is unrelated."""
    folder = tmp_path_factory.mktemp("certs")
    return {"ours": make_ca("redis-ca", folder), "other": make_ca("other-ca", folder)}


@pytest.fixture(scope="module")
def redis_server(cas: dict[str, CA]) -> Iterator[RedisServer]:
    cert, key = cas["ours"].issue("127.0.0.1", sans=("127.0.0.1", "localhost"))
    tls = RedisTlsFiles(cert, key, cas["ours"].cert)
    with RedisServer(user=USER, password=PASSWORD, tls=tls) as server:
        yield server


def ca_file(server: RedisServer) -> str:
    assert server.tls is not None
    return str(server.tls.ca)


@pytest.fixture(scope="module")
def media_server() -> Iterator[MediaServer]:
    with MediaServer() as server:
        server.put("/a.png", IMAGE_A)
        for name in ("slow-1", "slow-2"):  # each fault test holds the sidecar in its own fetch
            server.put(f"/{name}.png", IMAGE_A, delay_s=2.5)
        server.put("/expired.png", IMAGE_A)
        yield server


@pytest.fixture(scope="module")
def start_sidecar(
    tiny_vlm: Path, redis_server: RedisServer, media_dir: Path, tmp_path_factory: Any
) -> Iterator[Callable[..., SidecarProcess]]:
    started: list[SidecarProcess] = []
    logs = tmp_path_factory.mktemp("sidecar-logs")

    def start(*extra: str, limit: str = '{"image": 2}', env: dict[str, str] | None = None) -> Any:
        # The media server is on 127.0.0.1: the opt-in lets the sidecar fetch from it.
        domains = ("--allowed-media-domains", "127.0.0.1", "--allow-private-media-hosts")
        args = sidecar_args(limit, *domains, *extra)
        args = (*args, "--allowed-local-media-path", str(media_dir))
        args = (*args, "--redis-ca-file", ca_file(redis_server))
        log = logs / f"sidecar-{len(started)}.log"
        sidecar = SidecarProcess(tiny_vlm, redis_server.url, *args, log_path=log, env=env)
        started.append(sidecar.start())
        return sidecar

    yield start
    for sidecar in started:
        sidecar.kill()


@pytest.fixture(scope="module")
def sidecar(start_sidecar: Callable[..., SidecarProcess]) -> dict[str, SidecarProcess]:
    """The default-namespace sidecar (``["now"]``; a fault test replaces it)."""
    return {"now": start_sidecar("--concurrency", "2")}


def redis_settings(server: RedisServer, **overrides: Any) -> MmSettings:
    options: dict[str, Any] = {
        "processor": "redis",
        "redis_url": server.url,
        "redis_ca_file": ca_file(server),
        "sidecar_timeout_ms": TIMEOUT_MS,
        "sidecar_max_queue": MAX_QUEUE,
        "source": "flag",
    } | overrides
    return MmSettings(**options)


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def worker(
    vlm_llm: Any, serve_llm: Any, redis_server: RedisServer, sidecar: Any
) -> AsyncIterator[tuple[Any, Any]]:
    async with serve_llm(vlm_llm, redis_settings(redis_server)) as stack:
        yield stack


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def inprocess(vlm_llm: Any, serve_llm: Any) -> AsyncIterator[tuple[Any, Any]]:
    settings = MmSettings(processor="inprocess", source="flag", allow_private_media_hosts=True)
    async with serve_llm(vlm_llm, settings) as stack:
        yield stack


@pytest_asyncio.fixture(loop_scope="session")
async def control(redis_server: RedisServer) -> AsyncIterator[Any]:
    client = connect(redis_server.url, RedisTls(ca_file(redis_server)))
    yield client
    await client.aclose()


async def refused(stub: Any, request: pb.GenerateRequest) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await complete(stub, request)
    return info.value


def details(error: grpc.aio.AioRpcError) -> str:
    return error.details() or ""


async def advertised(stub: Any) -> str:
    return (await stub.GetServerInfo(pb.GetServerInfoRequest())).mm_processor


async def until_advertised(stub: Any, want: str, within_s: float) -> float:
    """Seconds until GetServerInfo's ``mm_processor`` is ``want`` (fails past ``within_s``)."""
    started = time.monotonic()
    # The state is the sidecar's hello in Redis, read through GetServerInfo.
    while await advertised(stub) != want:
        assert time.monotonic() - started < within_s, f"mm_processor never became {want!r}"
        await asyncio.sleep(0.2)
    return time.monotonic() - started


def keys_of(servicer: Any) -> p.Keys:
    return servicer.multimodal.processor.client.keys


def fingerprint_of_worker(servicer: Any) -> p.Fingerprint:
    return servicer.multimodal.processor.client.fingerprint


# Parity -----------------------------------------------------------------------------------------


async def test_media_refs_through_the_sidecar_give_the_inprocess_ids(  # noqa: PLR0917
    worker, inprocess, vlm_llm, ids, media_dir, media_server
) -> None:
    _, stub = worker
    _, local = inprocess
    cases = [
        (ids["one"], [data_url(IMAGE_A)], [IMAGE_A]),
        (ids["one"], [media_server.url("/a.png")], [IMAGE_A]),
        (ids["one"], [(media_dir / "a.png").as_uri()], [IMAGE_A]),
        (ids["two"], [data_url(IMAGE_A), data_url(IMAGE_B)], [IMAGE_A, IMAGE_B]),
    ]
    for prompt, urls, images in cases:
        want, prompt_len = await reference(vlm_llm, prompt, images)
        via_sidecar = await complete(stub, media_request(prompt, *urls))
        via_worker = await complete(local, media_request(prompt, *urls))
        assert list(via_sidecar.output_ids) == list(via_worker.output_ids) == want, urls[0][:30]
        assert via_sidecar.prompt_tokens == via_worker.prompt_tokens == prompt_len


async def test_concurrent_requests_all_come_back(worker, vlm_llm, ids) -> None:
    # As many as the queue holds (twice the sidecar's --concurrency): more could find the queue
    # full before the sidecar pops one, and be refused as they should (the overload test).
    _, stub = worker
    want, _ = await reference(vlm_llm, ids["one"], [IMAGE_A])
    got = await asyncio.gather(
        *(complete(stub, media_request(ids["one"], data_url(IMAGE_A))) for _ in range(MAX_QUEUE))
    )
    assert [list(g.output_ids) for g in got] == [want] * MAX_QUEUE


async def test_the_worker_advertises_redis_and_never_shows_the_password(
    worker, sidecar, caplog
) -> None:
    _, stub = worker
    info = await stub.GetServerInfo(pb.GetServerInfoRequest())
    assert info.mm_processor == "redis"
    assert sorted(info.mm_media_ref_schemes.split(",")) == ["data", "file", "http", "https"]
    assert PASSWORD.encode() not in info.SerializeToString()
    assert PASSWORD not in caplog.text
    assert PASSWORD not in sidecar["now"].log()
    assert f"rediss://{USER}:***@127.0.0.1" in sidecar["now"].log()


async def test_a_client_fault_in_the_sidecar_is_invalid_argument(worker, ids) -> None:
    _, stub = worker
    for url, code in [
        ("http://example.invalid/x.png", "domain_not_allowed"),
        (data_url(b"not an image"), "decode_failed"),
    ]:
        error = await refused(stub, media_request(ids["one"], url))
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert details(error).startswith(f"{code}: "), error.details()


# TLS, the ACL user and the password ------------------------------------------------------------


@contextlib.contextmanager
def worker_logs() -> Iterator[list[logging.LogRecord]]:
    """Every record our packages log meanwhile (the servicer routes them through vLLM's handlers,
    not the root logger that caplog watches)."""
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    handler = Keep(logging.DEBUG)
    names = ("smg_servicer_vllm", "smg_servicer_core", "smg_servicer_mm_sidecar", "vllm", "")
    loggers = [logging.getLogger(name) for name in names]
    for one in loggers:
        one.addHandler(handler)
    try:
        yield records
    finally:
        for one in loggers:
            one.removeHandler(handler)


def text_of(records: list[logging.LogRecord]) -> str:
    return "\n".join(record.getMessage() for record in records)


async def test_the_worker_serves_over_tls_and_logs_the_url_redacted(
    vlm_llm, serve_llm, redis_server, sidecar, ids
) -> None:
    with worker_logs() as records:
        async with serve_llm(vlm_llm, redis_settings(redis_server)) as (_, stub):
            await until_advertised(stub, "redis", within_s=ADVERTISED_S)
            want, _ = await reference(vlm_llm, ids["one"], [IMAGE_A])
            got = await complete(stub, media_request(ids["one"], data_url(IMAGE_A)))
    assert list(got.output_ids) == want
    logged = text_of(records)
    assert f"rediss://{USER}:***@127.0.0.1:{redis_server.port}/0" in logged
    assert PASSWORD not in logged and PASSWORD not in sidecar["now"].log()


async def test_a_wrong_password_or_ca_stops_the_worker_with_exit_2(
    vlm_llm, redis_server, cas
) -> None:
    from smg_grpc_servicer.vllm.servicer import VllmEngineServicer

    wrong_password = redis_settings(redis_server, redis_url=redis_server.url_as(USER, "wr0ng-pw"))
    wrong_ca = redis_settings(redis_server, redis_ca_file=str(cas["other"].cert))
    for settings, why in [
        (wrong_password, "refused the user name or password"),
        (wrong_ca, "the server's certificate does not verify"),
    ]:
        with worker_logs() as records, pytest.raises(SystemExit) as stopped:
            VllmEngineServicer(vlm_llm, time.time(), settings)
        assert stopped.value.code == 2
        (error,) = [r for r in records if r.levelno >= logging.ERROR]
        message = error.getMessage()
        assert "\n" not in message and why in message, message
        assert f"rediss://{USER}:***@127.0.0.1:{redis_server.port}/0" in message
        assert "wr0ng-pw" not in text_of(records) and PASSWORD not in text_of(records)


async def test_a_wrong_password_or_ca_stops_the_sidecar_with_exit_2(
    tiny_vlm, redis_server, cas
) -> None:
    prog = "python -m smg_grpc_servicer.vllm.mm_sidecar"

    def run(
        url: str, *args: str, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        # -X importtime: each import on stderr, to show that the refusal comes before vLLM's
        command = [sys.executable, "-X", "importtime", "-m", "smg_grpc_servicer.vllm.mm_sidecar"]
        command += ["--model"]
        command += [str(tiny_vlm), "--redis-url", url, *sidecar_args(), *args]
        return subprocess.run(
            command, capture_output=True, text=True, timeout=300, check=False,
            env={**environment(), **(env or {})},
        )  # fmt: skip

    # The CA by its variable here (the flag in the other case and the module's sidecars).
    runs = await asyncio.gather(
        asyncio.to_thread(
            run, redis_server.url_as(USER, "wr0ng-pw"), "--redis-ca-file", ca_file(redis_server)
        ),
        asyncio.to_thread(
            run, redis_server.url, env={"SMG_VLLM_MM_REDIS_CA_FILE": str(cas["other"].cert)}
        ),
    )
    for done, why in zip(
        runs, ["refused the user name or password", "certificate does not verify"], strict=True
    ):
        assert done.returncode == 2, done.stderr[-2000:]
        lines = [line for line in done.stderr.splitlines() if line.startswith(prog)]
        assert len(lines) == 1 and why in lines[0], done.stderr[-2000:]
        assert lines[0].startswith(f"{prog}: --redis-url rediss://{USER}:***@127.0.0.1:")
        assert done.stderr.rstrip().endswith(lines[0])  # the last word
        imported = {line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines()}
        assert "smg_servicer_mm_sidecar.client" in imported  # the listing is read right
        assert not {"vllm", "torch"} & imported  # refused in a second, before their imports
        assert "wr0ng-pw" not in done.stdout + done.stderr
        assert PASSWORD not in done.stdout + done.stderr


# Faults -----------------------------------------------------------------------------------------


async def test_a_job_past_its_deadline_is_not_processed(
    worker, control, ids, media_server, sidecar
) -> None:
    servicer, stub = worker
    now = int(time.time() * 1000)
    late = p.Job(
        v=1,
        job_id="late-job",
        request_id="late",
        fingerprint=fingerprint_of_worker(servicer),
        prompt_token_ids=ids["one"],
        prompt=None,
        items=[p.JobItem("image", media_server.url("/expired.png"))],
        enqueued_ms=now - TIMEOUT_MS - 1,
        deadline_ms=now - 1,
    )
    await control.lpush(keys_of(servicer).jobs, p.encode(late))
    await complete(stub, media_request(ids["one"], data_url(IMAGE_A)))  # queued behind it
    assert not media_server.hit("/expired.png").is_set()
    assert not await control.exists(keys_of(servicer).result("late-job"))
    assert await control.llen(keys_of(servicer).jobs) == 0


async def test_a_forged_hello_and_a_forged_result(
    vlm_llm, serve_llm, redis_server, control, ids
) -> None:
    settings = redis_settings(redis_server, sidecar_namespace="forge", sidecar_max_queue=2)
    async with serve_llm(vlm_llm, settings) as (servicer, stub):
        keys = keys_of(servicer)
        ours = fingerprint_of_worker(servicer)
        request = media_request(ids["one"], data_url(IMAGE_A))
        # No sidecar in this namespace: not advertised, and a request fails at once.
        assert await advertised(stub) == ""
        error = await refused(stub, request)
        assert error.code() == grpc.StatusCode.UNAVAILABLE
        assert details(error).startswith("sidecar_unavailable")

        def hello(fingerprint: p.Fingerprint) -> dict[str, str]:
            return p.hello_fields(p.Hello(fingerprint, 1, ("data",), time.time(), "flag", 1 << 20))

        await control.hset(keys.hello, mapping=hello(ours))
        await until_advertised(stub, "redis", within_s=ADVERTISED_S)

        # A result made for another configuration is rejected.
        call = asyncio.create_task(refused(stub, request))
        _, raw = await control.brpop([keys.jobs], timeout=5)
        job = p.decode_job(raw)
        assert job.fingerprint == ours and job.deadline_ms - job.enqueued_ms == TIMEOUT_MS
        forged = p.JobResult(
            v=1,
            job_id=job.job_id,
            ok=True,
            fingerprint=msgspec.structs.replace(ours, model="another-model"),
            prompt_token_ids=list(ids["one"]),
        )
        await control.lpush(keys.result(job.job_id), p.encode(forged))
        error = await call
        assert error.code() == grpc.StatusCode.UNAVAILABLE
        assert details(error).startswith("fingerprint_mismatch")

        # A result that places more embeddings than the model makes for one image (it would
        # fail inside the engine and kill it) or undecodable tensors: refused, engine unharmed.
        image = ids["<image>"]
        # 200 positions: more than any picture of the tiny VLM makes (4 embeddings, or 20 split).
        for placeholder, blob in [(p.Placeholder(5, 200), b"x"), (p.Placeholder(5, 4), b"\xc1")]:
            call = asyncio.create_task(refused(stub, request))
            _, raw = await control.brpop([keys.jobs], timeout=5)
            job = p.decode_job(raw)
            bad = msgspec.structs.replace(
                forged,
                job_id=job.job_id,
                fingerprint=ours,
                prompt_token_ids=[*ids["one"][:5], *([image] * 200), *ids["one"][5:]],
                mm_hashes={"image": ["h"]},
                mm_placeholders={"image": [placeholder]},
                mm_kwargs={"image": [blob]},
            )
            await control.lpush(keys.result(job.job_id), p.encode(bad))
            error = await call
            assert error.code() == grpc.StatusCode.UNAVAILABLE
            assert details(error).startswith("sidecar_protocol")

        # A queue at the limit fails fast (not at the deadline), and nothing is pushed.
        await until_advertised(stub, "redis", within_s=ADVERTISED_S)
        await control.lpush(keys.jobs, b"queued-1", b"queued-2")
        started = time.monotonic()
        error = await refused(stub, request)
        assert error.code() == grpc.StatusCode.UNAVAILABLE
        assert details(error).startswith("sidecar_overloaded")
        assert time.monotonic() - started < FAST_S
        assert await control.llen(keys.jobs) == 2
        await control.delete(keys.jobs)

        # A hello whose fingerprint disagrees: the worker stops advertising.
        await control.hset(keys.hello, mapping=hello(msgspec.structs.replace(ours, dtype="x")))
        await until_advertised(stub, "", within_s=ADVERTISED_S)
        await control.delete(keys.hello)


async def test_a_result_over_the_cap_is_media_too_large(
    vlm_llm, serve_llm, redis_server, start_sidecar, ids
) -> None:
    # The same limit spelled another way: the fingerprints still agree.
    small = start_sidecar(
        "--namespace",
        "small",
        limit='{"image": {"count": 2}}',
        env={"SMG_VLLM_MM_MAX_RESULT_BYTES": "4096"},
    )
    settings = redis_settings(redis_server, sidecar_namespace="small")
    async with serve_llm(vlm_llm, settings) as (_, stub):
        await until_advertised(stub, "redis", within_s=ADVERTISED_S)
        error = await refused(stub, media_request(ids["one"], data_url(IMAGE_A)))
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert details(error).startswith("media_too_large: ")
        # A clean stop: exit 0, hello removed, the worker stops advertising at once (not when
        # the hello's TTL runs out).
        assert small.stop() == 0
        assert await until_advertised(stub, "", within_s=p.HELLO_TTL_S) < p.HELLO_TTL_S


async def test_redis_killed_mid_job_then_restarted(
    worker, redis_server, media_server, vlm_llm, ids
) -> None:
    _, stub = worker
    call = asyncio.create_task(
        refused(stub, media_request(ids["one"], media_server.url("/slow-1.png")))
    )
    assert await asyncio.to_thread(media_server.hit("/slow-1.png").wait, 15)
    redis_server.kill()
    started = time.monotonic()
    error = await call
    assert error.code() == grpc.StatusCode.UNAVAILABLE
    assert details(error).startswith("sidecar_unavailable")
    assert time.monotonic() - started < FAST_S  # at once, not at the deadline
    redis_server.start()  # empty: the sidecar announces itself again, nobody restarts
    await until_advertised(stub, "redis", within_s=15)
    want, _ = await reference(vlm_llm, ids["one"], [IMAGE_A])
    got = await complete(stub, media_request(ids["one"], data_url(IMAGE_A)))
    assert list(got.output_ids) == want


async def test_the_sidecar_killed_mid_job(  # noqa: PLR0917
    worker, sidecar, start_sidecar, media_server, vlm_llm, serve_llm, redis_server, ids
) -> None:
    _, stub = worker
    short = redis_settings(redis_server, sidecar_timeout_ms=SHORT_TIMEOUT_MS)
    async with serve_llm(vlm_llm, short) as (_, short_stub):
        await until_advertised(short_stub, "redis", within_s=ADVERTISED_S)
        sent = time.monotonic()
        call = asyncio.create_task(
            refused(short_stub, media_request(ids["one"], media_server.url("/slow-2.png")))
        )
        assert await asyncio.to_thread(media_server.hit("/slow-2.png").wait, 15)
        sidecar["now"].kill()
        error = await call
        ended_s = time.monotonic() - sent
    # The job died with the sidecar: the request ends at its deadline (not before, and long
    # before a wait without one would give up), with a code the router does not retry.
    assert error.code() == grpc.StatusCode.INTERNAL
    assert details(error).startswith("sidecar_timeout")
    assert SHORT_TIMEOUT_MS / 1000 - 0.5 <= ended_s < SHORT_TIMEOUT_MS / 1000 + FAST_S
    # Its hello expires within the TTL (Redis expires keys lazily and every 100 ms: a margin of
    # a few seconds); then the worker stops advertising.
    await until_advertised(stub, "", within_s=p.HELLO_TTL_S + FAST_S)
    sidecar["now"] = start_sidecar()
    await until_advertised(stub, "redis", within_s=ADVERTISED_S)
    want, _ = await reference(vlm_llm, ids["one"], [IMAGE_A])
    got = await complete(stub, media_request(ids["one"], data_url(IMAGE_A)))
    assert list(got.output_ids) == want


async def test_no_result_key_is_left_without_a_ttl(worker, control, sidecar) -> None:
    keys = [k async for k in control.scan_iter(match=f"{p.PREFIX}:*:res:*")]
    for key in keys:  # results of given-up jobs, pushed late: they expire with the result TTL
        assert 0 < await control.ttl(key) <= p.RESULT_TTL_S
    servicer, _ = worker
    assert sidecar["now"].stop() == 0
    assert not await control.exists(keys_of(servicer).hello)


async def test_without_the_redis_client_the_worker_exits_2_naming_the_extra(tiny_vlm: Path) -> None:
    code = (
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] == 'redis':\n"
        "            raise ImportError(name)\n"
        "sys.meta_path.insert(0, Block())\n"
        "import torch\n"
        "from types import SimpleNamespace\n"
        "from smg_servicer_core.errors import ConfigError\n"
        "from smg_servicer_vllm.mm_redis import RedisProcessor\n"
        "from smg_servicer_vllm.mm_settings import MmSettings\n"
        "try:\n"
        "    RedisProcessor(SimpleNamespace(), MmSettings(processor='redis'), torch.float32)\n"
        "except ConfigError as exc:\n"
        "    print(exc)\n"
    )
    import subprocess
    import sys

    out = await asyncio.to_thread(  # the session's loop serves the other modules' workers
        subprocess.run,
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=180, check=True,
    )  # fmt: skip
    assert "pip install 'smg-servicer-vllm[redis]'" in out.stdout

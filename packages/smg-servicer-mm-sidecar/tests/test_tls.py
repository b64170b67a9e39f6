"""Both ends over ``rediss://`` with an ACL user, against a real redis-server that speaks TLS only
(certificates made here): a job round-trips; the start check tells a refusal (wrong password, no
credentials, a CA that does not verify the server, a client certificate missing or from another
CA) from an outage; Redis gone while serving is ``sidecar_unavailable``; no message carries the
password."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from smg_servicer_core.testing.certs import CA, make_ca
from smg_servicer_core.testing.redis_server import RedisServer, RedisTlsFiles
from smg_servicer_mm_sidecar import protocol as p
from smg_servicer_mm_sidecar.client import (
    RedisRejected,
    RedisTls,
    SidecarClient,
    check_redis,
    connect,
)
from smg_servicer_mm_sidecar.service import Sidecar

pytestmark = [pytest.mark.contract, pytest.mark.asyncio(loop_scope="module")]

FP = p.Fingerprint("m", "0.32.0", "float32", "opencv", "{}", "{}", "image=2,video=*,audio=*")
ITEMS = [p.JobItem("image", "data:image/png;base64,AAAA")]
USER, PASSWORD = "mm-sidecar", "Tls-Pa55-w0rd"


class Echo:
    schemes: tuple[str, ...] = ("data",)

    async def process(self, job: p.Job) -> p.JobResult:
        return p.JobResult(
            v=1, job_id=job.job_id, ok=True, fingerprint=FP,
            prompt_token_ids=[*job.prompt_token_ids, 9],
        )  # fmt: skip


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    folder = tmp_path_factory.mktemp("certs")
    ca, other = make_ca("redis-ca", folder), make_ca("other-ca", folder)
    cert, key = ca.issue("127.0.0.1", sans=("127.0.0.1", "localhost"))
    return {"ca": ca, "other": other, "server": RedisTlsFiles(cert, key, ca.cert), "dir": folder}


@pytest.fixture(scope="module")
def redis_server(certs: dict[str, Any]) -> Iterator[RedisServer]:
    with RedisServer(user=USER, password=PASSWORD, tls=certs["server"]) as server:
        yield server


def trust(ca: CA, client: tuple[Path, Path] | None = None) -> RedisTls:
    cert, key = client or (None, None)
    return RedisTls(str(ca.cert), cert and str(cert), key and str(key))


def rejected(url: str, tls: RedisTls | None) -> str:
    with pytest.raises(RedisRejected) as error:
        check_redis(url, tls)
    message = str(error.value)
    assert PASSWORD not in message and "wrong-pass" not in message and "\n" not in message
    return message


@pytest_asyncio.fixture(loop_scope="module")
async def stack(
    redis_server: RedisServer, certs: dict[str, Any]
) -> AsyncIterator[tuple[SidecarClient, Any]]:
    tls = trust(certs["ca"])
    sidecar = Sidecar(connect(redis_server.url, tls), FP, Echo(), poll_s=0.2)
    client = SidecarClient(connect(redis_server.url, tls), FP, timeout_ms=30_000, max_queue=8)
    stop = asyncio.Event()
    running = asyncio.create_task(sidecar.run(stop))
    await asyncio.wait_for(sidecar.announced.wait(), 5)
    try:
        yield client, sidecar
    finally:
        stop.set()
        await asyncio.wait_for(running, 15)
        await client.aclose()
        await sidecar.redis.aclose()


async def test_a_job_round_trips_over_tls_and_an_outage_is_unavailable(stack, redis_server) -> None:
    client, _ = stack
    assert redis_server.url.startswith(f"rediss://{USER}:{PASSWORD}@127.0.0.1:")
    result = await client.submit("r1", [5, 6], None, ITEMS)
    assert result.ok and result.prompt_token_ids == [5, 6, 9]
    redis_server.kill()
    with pytest.raises(p.SidecarError) as error:
        await asyncio.wait_for(client.submit("r2", [5, 6], None, ITEMS), 5)
    assert error.value.code == p.SIDECAR_UNAVAILABLE and error.value.status == "UNAVAILABLE"
    redis_server.start()  # the same port and certificate: both ends come back by themselves
    for _ in range(100):
        with contextlib.suppress(p.SidecarError):
            result = await client.submit("r3", [7], None, ITEMS)
            break
        await asyncio.sleep(0.1)
    assert result.prompt_token_ids == [7, 9]


async def test_the_start_check_tells_a_refusal_from_an_outage(
    redis_server, certs: dict[str, Any]
) -> None:
    ca, other = certs["ca"], certs["other"]
    assert check_redis(redis_server.url, trust(ca)) is None
    wrong = rejected(redis_server.url_as(USER, "wrong-pass"), trust(ca))
    assert "refused the user name or password" in wrong
    # The default user is off: a connection must log in as the ACL user.
    assert "refused" in rejected(redis_server.url_as(None, None), trust(ca))
    for tls in (trust(other), None):  # another CA; the system's CAs
        message = rejected(redis_server.url, tls)
        assert "TLS handshake failed" in message and "does not verify" in message
    # Plain text to the TLS port, and a stopped server: not reachable now, not a refusal.
    plain = redis_server.url.replace("rediss://", "redis://")
    assert check_redis(plain, None, timeout_s=1.0)
    redis_server.stop()
    try:
        reason = check_redis(redis_server.url, trust(ca), timeout_s=1.0)
        assert reason is not None and PASSWORD not in reason
    finally:
        redis_server.start()


async def test_a_redis_that_asks_for_client_certificates(certs: dict[str, Any]) -> None:
    ca, other = certs["ca"], certs["other"]
    mutual = RedisTlsFiles(certs["server"].cert, certs["server"].key, ca.cert, auth_clients=True)
    with RedisServer(user=USER, password=PASSWORD, tls=mutual) as server:
        ours = trust(ca, ca.issue("worker", client=True))
        assert check_redis(server.url, ours) is None
        redis = connect(server.url, ours)
        try:
            assert await redis.set("k", b"v") and await redis.get("k") == b"v"
        finally:
            await redis.aclose()
        assert "client certificate" in rejected(server.url, trust(ca))
        theirs = trust(ca, other.issue("worker", client=True))
        assert "TLS handshake failed" in rejected(server.url, theirs)


#: The ACL the README gives as an example: the protocol's keys and commands only.
README_ACL = (
    "~smg:mm:*",
    "+@list",
    "+@hash",
    "+@keyspace",
    "+@transaction",
    "+ping",
    "+config|get",
)


async def test_the_readme_acl_is_enough_for_both_ends(certs: dict[str, Any]) -> None:
    with RedisServer(user=USER, password=PASSWORD, tls=certs["server"], acl=README_ACL) as server:
        tls = trust(certs["ca"])
        assert check_redis(server.url, tls) is None
        sidecar = Sidecar(connect(server.url, tls), FP, Echo(), poll_s=0.2)
        client = SidecarClient(connect(server.url, tls), FP, timeout_ms=30_000, max_queue=8)
        stop = asyncio.Event()
        running = asyncio.create_task(sidecar.run(stop))
        try:
            await asyncio.wait_for(sidecar.announced.wait(), 5)
            assert sidecar._fitted  # pyright: ignore[reportPrivateUsage] - CONFIG GET allowed
            result = await client.submit("r1", [5], None, ITEMS)
            assert result.prompt_token_ids == [5, 9]
        finally:
            stop.set()
            await asyncio.wait_for(running, 15)
            await client.aclose()
            await sidecar.redis.aclose()
        # Keys outside the namespace are not the user's.
        outside = connect(server.url, tls)
        try:
            with pytest.raises(Exception, match=r"(?i)no permissions to access"):
                await outside.lpush("elsewhere", b"x")
        finally:
            await outside.aclose()

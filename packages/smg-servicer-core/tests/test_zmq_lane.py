"""The ZMQ lane's shared parts on real ZMQ sockets: the handshake relay (frames both ways, the
outputs learnt, the sentinel) and the handshake address a launcher is given. That the port rule is
the router's own: packages/smg-servicer-vllm/tests/test_headless.py (it needs the router wheel)."""

from __future__ import annotations

import msgspec
import pytest
import zmq

from smg_servicer_core.zmq_lane import (
    ENGINE_CORE_DEAD,
    HandshakeRelay,
    handshake_address,
    handshake_port,
)

pytestmark = pytest.mark.unit

IDENTITY = (0).to_bytes(2, "little")  # engine index 0, as the engines name themselves


def test_the_relay_forwards_the_handshake_and_tells_the_router_a_core_died(tmp_path) -> None:
    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    output = ctx.socket(zmq.PULL)
    out_address = f"ipc://{tmp_path}/engine-out.sock"
    output.bind(out_address)
    relay = HandshakeRelay(f"tcp://127.0.0.1:{port}")
    core = ctx.socket(zmq.DEALER)
    core.setsockopt(zmq.IDENTITY, IDENTITY)
    core.connect(relay.address)
    try:
        hello = msgspec.msgpack.encode({"status": "HELLO", "local": False, "headless": True})
        core.send(hello)
        assert router.poll(5000), "HELLO never reached the router"
        assert router.recv_multipart() == [IDENTITY, hello]  # the core's own identity
        assert relay.outputs() == []

        init = msgspec.msgpack.encode(
            {
                "addresses": {"inputs": ["ipc://in"], "outputs": [out_address]},
                "parallel_config": {},
            }
        )
        router.send_multipart([IDENTITY, init])
        assert core.poll(5000), "INIT never reached the core"
        assert core.recv() == init
        assert relay.outputs() == [out_address]

        ready = msgspec.msgpack.encode({"status": "READY", "local": False, "headless": True})
        core.send(ready)
        assert router.poll(5000) and router.recv_multipart() == [IDENTITY, ready]

        assert relay.send_dead() == [out_address]
        assert output.poll(5000), "the router's output socket got no sentinel"
        assert output.recv() == ENGINE_CORE_DEAD
    finally:
        relay.close()
        for sock in (router, output, core):
            sock.close(linger=0)
        ctx.term()


def test_a_relay_that_saw_no_init_tells_no_one() -> None:
    relay = HandshakeRelay("tcp://127.0.0.1:9")
    try:
        assert relay.send_dead() == []
    finally:
        relay.close()


def test_the_handshake_address_comes_from_either_flag() -> None:
    url = "ipc:///run/smg/a"
    assert handshake_address(None, url) == f"tcp://127.0.0.1:{handshake_port(url)}"
    assert handshake_address("tcp://10.0.0.1:5", None) == "tcp://10.0.0.1:5"
    with pytest.raises(ValueError, match="ipc://PATH"):
        handshake_address(None, "tcp://127.0.0.1:5")
    with pytest.raises(ValueError, match="tcp://HOST:PORT"):
        handshake_address("ipc:///x", None)
    with pytest.raises(ValueError, match="name the router's handshake"):
        handshake_address(None, None)

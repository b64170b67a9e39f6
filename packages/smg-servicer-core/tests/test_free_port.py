"""core.testing.process.free_port: the ports tests hand their workers."""

from __future__ import annotations

import socket

import pytest

from smg_servicer_core.testing import process

pytestmark = pytest.mark.unit


def test_ports_are_free_below_the_ephemeral_range_and_never_handed_out_twice() -> None:
    """Under the kernel's ephemeral range (an outgoing connection elsewhere on the machine cannot
    take the port between the check and the worker's bind) and never the same twice in one
    process (a worker's gRPC and metrics ports, asked for one after the other)."""
    low = process._ephemeral_low()
    ports = [process.free_port(below=20000 + 400) for _ in range(300)]
    assert len(set(ports)) == len(ports)
    assert all(20000 <= p < min(20400, low) for p in ports)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", ports[0]))  # free when handed out: nothing took it


def test_no_free_port_left_is_an_error() -> None:
    taken = [process.free_port(below=20000 + 500) for _ in range(5)]
    with pytest.raises(RuntimeError, match="no free port"):
        for _ in range(600):  # the range runs out: the ports handed out are never reused
            taken.append(process.free_port(below=20000 + 500))

"""core.testing.process.free_port: the ports tests hand their workers."""

from __future__ import annotations

import socket
import sys
from pathlib import Path

import pytest

from smg_servicer_core.testing import process

pytestmark = pytest.mark.unit


@pytest.fixture(autouse=True)
def _whole_range(monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests name their own ranges: the session's (tools/test.sh) is not theirs."""
    monkeypatch.delenv(process.PORT_RANGE_ENV, raising=False)


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


def test_a_session_draws_from_its_own_range(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two test sessions run at once (tools/test.sh) each get a range of their own: one never
    hands out a port the other may bind a moment later."""
    monkeypatch.setenv(process.PORT_RANGE_ENV, "20600-20700")
    ports = [process.free_port() for _ in range(50)]
    assert all(20600 <= p < 20700 for p in ports), ports
    for bad, why in (("20800-20700", "is empty"), ("20600", "expected LOW-HIGH"), ("a-b", "LOW")):
        monkeypatch.setenv(process.PORT_RANGE_ENV, bad)
        with pytest.raises(RuntimeError, match=why):
            process.free_port()


def test_no_free_port_left_is_an_error() -> None:
    taken = [process.free_port(below=20000 + 500) for _ in range(5)]
    with pytest.raises(RuntimeError, match="no free port"):
        for _ in range(600):  # the range runs out: the ports handed out are never reused
            taken.append(process.free_port(below=20000 + 500))


def test_a_port_file_read_while_half_written_waits_for_the_number(tmp_path: Path) -> None:
    """A server that creates its port file before writing the number (a plain ``write_text``)
    is waited for, not read as ``''`` (the CI run of 2026-12-06 failed so)."""
    port_file = tmp_path / "port"
    slow_writer = (
        "import sys, time; f = open(sys.argv[1], 'w'); f.flush(); time.sleep(0.5);"
        " f.write('4321'); f.close(); time.sleep(30)"
    )
    proc, port = process.spawn_with_port_file(
        [sys.executable, "-c", slow_writer, str(port_file)], port_file, timeout_s=20
    )
    try:
        assert port == 4321
    finally:
        proc.kill()
        proc.wait()


def test_announce_port_never_leaves_a_half_written_file(tmp_path: Path) -> None:
    port_file = tmp_path / "port"
    process.announce_port(port_file, 5678)
    assert port_file.read_text() == "5678"
    assert [p.name for p in tmp_path.iterdir()] == ["port"]

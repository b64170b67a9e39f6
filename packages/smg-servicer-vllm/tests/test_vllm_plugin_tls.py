"""TLS through the plugin, on vLLM's real parsers: ``vllm serve --grpc`` reads vLLM's own
``--ssl-*`` flags, the launcher module gains them, ``SMG_SERVICER_SSL_*`` is the fallback, a bad
file exits 2 with one line at the parse, and vLLM's ``add_insecure_port`` binds a TLS-only port.
The whole launcher over mutual TLS, through the router, is tests-integration's
``test_tls_and_shutdown``."""

from __future__ import annotations

import sys
import types
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from smg_servicer_core.testing.certs import MutualTls, mutual_tls
from smg_servicer_vllm import plugin

pytestmark = pytest.mark.unit

MODEL = "/models/m"


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> MutualTls:
    return mutual_tls(tmp_path_factory.mktemp("pki"))


@pytest.fixture(autouse=True)
def registered(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(plugin.SETTINGS_ENV):
        monkeypatch.delenv(name, raising=False)
    plugin.register()
    monkeypatch.setattr(plugin, "_launched", {})


def _serve(*args: str) -> Any:
    from vllm.entrypoints.cli.serve import ServeSubcommand
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser(prog="vllm")
    ServeSubcommand().subparser_init(parser.add_subparsers(dest="subparser"))
    return parser.parse_args(["serve", MODEL, "--grpc", *args])


def _launcher(monkeypatch: pytest.MonkeyPatch, *args: str) -> Any:
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    main = types.ModuleType("__main__")
    main.__spec__ = types.SimpleNamespace(name=plugin.LAUNCHER_MODULES[0])  # type: ignore[assignment]
    monkeypatch.setitem(sys.modules, "__main__", main)
    parser = FlexibleArgumentParser(description="vLLM gRPC Server")
    parser.add_argument("--host", default="0.0.0.0")
    parser.add_argument("--port", type=int, default=50051)
    return AsyncEngineArgs.add_cli_args(parser).parse_args(["--model", MODEL, *args])


def test_vllm_serve_grpc_reads_vllms_own_ssl_flags(pki: MutualTls) -> None:
    _serve(*pki.server_flags())
    launch = plugin.launcher_settings()
    assert launch is not None and launch.tls is not None
    assert launch.tls.client_ca == pki.ca.cert.read_bytes()
    assert launch.tls.describe().startswith("mutual TLS")


def test_the_launcher_module_gains_the_ssl_flags_and_the_margin(
    pki: MutualTls, monkeypatch: pytest.MonkeyPatch
) -> None:
    args = _launcher(monkeypatch, *pki.server_flags(), "--shutdown-margin", "4")
    assert args.ssl_certfile == str(pki.server[0])
    launch = plugin.launcher_settings()
    assert launch is not None and launch.tls is not None and launch.shutdown_margin_s == 4.0


def test_the_variables_are_the_fallback(pki: MutualTls, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SMG_SERVICER_SSL_CERTFILE", str(pki.server[0]))
    monkeypatch.setenv("SMG_SERVICER_SSL_KEYFILE", str(pki.server[1]))
    _launcher(monkeypatch)
    launch = plugin.launcher_settings()
    assert launch is not None and launch.tls is not None and launch.tls.client_ca is None


def test_no_tls_flag_leaves_the_port_plain(monkeypatch: pytest.MonkeyPatch) -> None:
    _launcher(monkeypatch)
    launch = plugin.launcher_settings()
    assert launch is not None and launch.tls is None


def test_a_bad_key_exits_2_with_one_line(
    pki: MutualTls,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    missing = tmp_path / "missing.key"
    with pytest.raises(SystemExit) as exited:
        _launcher(monkeypatch, "--ssl-certfile", str(pki.server[0]), "--ssl-keyfile", str(missing))
    assert exited.value.code == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1 and "--ssl-keyfile: cannot read" in lines[0], lines


async def test_vllms_insecure_port_call_binds_a_tls_port(pki: MutualTls) -> None:
    """What vLLM's launcher does after registering our servicer, on a server made secure."""
    from smg_servicer_core.config import resolve
    from smg_servicer_core.tls import TLS_SETTINGS, load_server_tls

    tls = load_server_tls(
        resolve(
            TLS_SETTINGS,
            None,
            {
                "SMG_SERVICER_SSL_CERTFILE": str(pki.server[0]),
                "SMG_SERVICER_SSL_KEYFILE": str(pki.server[1]),
                "SMG_SERVICER_SSL_CA_CERTS": str(pki.ca.cert),
            },
        )
    )
    assert tls is not None
    server = grpc.aio.server()
    health_pb2_grpc.add_HealthServicer_to_server(health.aio.HealthServicer(), server)  # pyright: ignore[reportUnknownMemberType, reportAttributeAccessIssue]
    plugin.secure_ports(server, tls)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        request = health_pb2.HealthCheckRequest()
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as plain:
            stub: Any = health_pb2_grpc.HealthStub(plain)
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await stub.Check(request, timeout=5)
            assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
        credentials = grpc.ssl_channel_credentials(
            root_certificates=pki.ca.cert.read_bytes(),
            private_key=pki.client[1].read_bytes(),
            certificate_chain=pki.client[0].read_bytes(),
        )
        async with grpc.aio.secure_channel(f"127.0.0.1:{port}", credentials) as secure:
            stub = health_pb2_grpc.HealthStub(secure)
            reply = await stub.Check(request, timeout=5)
            assert reply.status == health_pb2.HealthCheckResponse.SERVING
    finally:
        await server.stop(0)

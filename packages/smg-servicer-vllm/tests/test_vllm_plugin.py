"""The ``vllm.general_plugins`` entry point on vLLM's real command-line parsers: the ``--mm-*`` and
``--metrics-*`` flags exist on gRPC parses only, each falls back to its variable with a
deprecation line, a bad value exits 2 with one line, and a non-gRPC parse is left untouched."""

from __future__ import annotations

import argparse
import subprocess
import sys
import types
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from smg_servicer_core.testing.certs import MutualTls, mutual_tls
from smg_servicer_vllm import plugin, releases

# vLLM's real parsers (and its launcher, which exits before it builds an engine): no engine runs.
pytestmark = pytest.mark.unit

MODEL = "/models/m"


@pytest.fixture(autouse=True)
def registered(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(plugin.SETTINGS_ENV):
        monkeypatch.delenv(name, raising=False)
    plugin.register()
    plugin.register()  # vLLM may load its plugins more than once per process
    monkeypatch.setattr(plugin, "_launched", {})


def serve_parser() -> Any:
    """``vllm``'s top-level parser with its ``serve`` subcommand, as ``vllm`` builds it."""
    from vllm.entrypoints.cli.serve import ServeSubcommand
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser(prog="vllm")
    ServeSubcommand().subparser_init(parser.add_subparsers(dest="subparser"))
    return parser


def launcher_parser(monkeypatch: pytest.MonkeyPatch) -> Any:
    """``python -m vllm.entrypoints.launchers.grpc_server``'s parser, ``__main__`` its module."""
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    main = types.ModuleType("__main__")
    main.__spec__ = types.SimpleNamespace(name=plugin.LAUNCHER_MODULES[0])  # type: ignore[assignment]
    monkeypatch.setitem(sys.modules, "__main__", main)
    parser = FlexibleArgumentParser(description="vLLM gRPC Server")
    parser.add_argument("--host", default="0.0.0.0")
    parser.add_argument("--port", type=int, default=50051)
    return AsyncEngineArgs.add_cli_args(parser)


def test_the_entry_point_is_registered() -> None:
    (found,) = [e for e in entry_points(group="vllm.general_plugins") if e.name == "smg-servicer"]
    assert found.value == "smg_servicer_vllm.plugin:register"


def test_a_serve_parse_without_grpc_is_untouched() -> None:
    args = serve_parser().parse_args(["serve", MODEL])
    assert not hasattr(args, "mm_processor") and not hasattr(args, "metrics_port")
    assert plugin.launcher_settings() is None
    with pytest.raises(SystemExit):  # not a flag of the HTTP server
        serve_parser().parse_args(["serve", MODEL, "--mm-processor", "inprocess"])


def test_every_flag_on_vllm_serve_grpc() -> None:
    serve_parser().parse_args(
        [
            "serve",
            MODEL,
            "--grpc",
            "--mm-processor",
            "inprocess",
            "--mm-max-inflight",
            "3",
            "--mm-max-items",
            "image=2",
            "--mm-max-item-bytes",
            "4096",
            "--mm-redis-url",
            "redis://u:secret@10.0.0.1:6380/1",
            "--mm-sidecar-timeout-ms",
            "500",
            "--mm-sidecar-max-queue",
            "7",
            "--mm-sidecar-namespace",
            "ns-1",
            "--metrics-port",
            "9100",
            "--metrics-host",
            "127.0.0.1",
        ]
    )
    launch = plugin.launcher_settings()
    assert launch is not None
    mm = launch.mm
    assert (mm.processor, mm.source, mm.max_inflight, dict(mm.max_items or {})) == (
        "inprocess",
        "flag",
        3,
        {"image": 2},
    )
    assert (mm.max_item_bytes, mm.sidecar_timeout_ms, mm.sidecar_max_queue) == (4096, 500, 7)
    assert (mm.redis_url, mm.sidecar_namespace) == ("redis://u:secret@10.0.0.1:6380/1", "ns-1")
    assert set(mm.sources.values()) == {"flag", "default"}  # the frame cap is env-only
    assert "secret" not in mm.describe() and "***@10.0.0.1:6380" in mm.describe()
    assert (launch.metrics["metrics_port"], launch.metrics["metrics_host"]) == (9100, "127.0.0.1")


def test_the_parsed_arguments_hide_the_redis_password(monkeypatch: pytest.MonkeyPatch) -> None:
    """vLLM's launcher logs its parsed arguments (``vLLM gRPC server args: Namespace(...)``)."""
    url = "rediss://alice:s3cret@10.0.0.1:6380/1"
    args = launcher_parser(monkeypatch).parse_args(["--model", MODEL, "--mm-redis-url", url])
    assert "s3cret" not in f"{args}" and "alice:***@10.0.0.1:6380" in f"{args}"
    launch = plugin.launcher_settings()
    assert launch is not None and str(launch.mm.redis_url) == str(args.mm_redis_url) == url


def test_the_launcher_module_gets_the_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    args = launcher_parser(monkeypatch).parse_args(["--model", MODEL, "--mm-processor", "off"])
    assert args.mm_processor == "off"
    launch = plugin.launcher_settings()
    assert launch is not None and (launch.mm.processor, launch.mm.source) == ("off", "flag")


@pytest.mark.parametrize(
    ("variable", "value", "field", "expected"),
    [
        ("SMG_VLLM_MM_PROCESSOR", "inprocess", "processor", "inprocess"),
        ("SMG_VLLM_MM_MAX_INFLIGHT", "5", "max_inflight", 5),
        ("SMG_VLLM_MM_MAX_ITEMS", "3", "max_items", {"image": 3, "video": 3, "audio": 3}),
        ("SMG_VLLM_MM_MAX_ITEM_BYTES", "1024", "max_item_bytes", 1024),
        (
            "SMG_VLLM_MM_REDIS_URL",
            "redis://127.0.0.1:7000/0",
            "redis_url",
            "redis://127.0.0.1:7000/0",
        ),
        ("SMG_VLLM_MM_SIDECAR_TIMEOUT_MS", "250", "sidecar_timeout_ms", 250),
        ("SMG_VLLM_MM_SIDECAR_MAX_QUEUE", "9", "sidecar_max_queue", 9),
        ("SMG_VLLM_MM_SIDECAR_NAMESPACE", "abc", "sidecar_namespace", "abc"),
    ],
)
def test_each_flag_falls_back_to_its_variable_with_a_deprecation_line(  # noqa: PLR0917
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    variable: str,
    value: str,
    field: str,
    expected: Any,
) -> None:
    monkeypatch.setenv(variable, value)
    with caplog.at_level("WARNING"):
        launcher_parser(monkeypatch).parse_args(["--model", MODEL])
    launch = plugin.launcher_settings()
    assert launch is not None
    got = getattr(launch.mm, field)
    assert (dict(got) if isinstance(got, dict) else got) == expected
    assert launch.mm.sources[field] == "env"
    assert f"{variable} is deprecated and goes away in the next minor release" in caplog.text


def test_a_flag_wins_over_its_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SMG_VLLM_MM_MAX_INFLIGHT", "5")
    launcher_parser(monkeypatch).parse_args(["--model", MODEL, "--mm-max-inflight", "2"])
    launch = plugin.launcher_settings()
    assert launch is not None and (launch.mm.max_inflight, launch.mm.sources["max_inflight"]) == (
        2,
        "flag",
    )


def test_the_video_frame_cap_is_env_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SMG_VLLM_MM_MAX_VIDEO_FRAMES", "16")
    parser = launcher_parser(monkeypatch)
    args = parser.parse_args(["--model", MODEL])
    launch = plugin.launcher_settings()
    assert launch is not None and launch.mm.max_video_frames == 16
    assert not hasattr(args, "mm_max_video_frames")


@pytest.mark.parametrize(
    ("argv", "env", "message"),
    [
        (["--mm-processor", "smg"], {}, "--mm-processor: invalid value 'smg'"),
        (["--mm-processor", "gpu"], {}, "expected one of off, inprocess, redis"),
        (["--mm-max-inflight", "0"], {}, "--mm-max-inflight: must be a positive integer"),
        (["--mm-max-items", "image=two"], {}, "--mm-max-items: invalid value"),
        (["--mm-redis-url", "http://x"], {}, "--mm-redis-url: expected a redis://"),
        ([], {"SMG_VLLM_MM_SIDECAR_TIMEOUT_MS": "soon"}, "SMG_VLLM_MM_SIDECAR_TIMEOUT_MS: invalid"),
        ([], {"SMG_VLLM_MM_MAX_VIDEO_FRAMES": "-1"}, "SMG_VLLM_MM_MAX_VIDEO_FRAMES: must be 0"),
        (["--metrics-port", "70000"], {}, "--metrics-port: must be a TCP port"),
    ],
)
def test_a_bad_value_exits_2_with_one_line_whatever_the_mode(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    argv: list[str],
    env: dict[str, str],
    message: str,
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(SystemExit) as exited:
        launcher_parser(monkeypatch).parse_args(["--model", MODEL, *argv])
    assert exited.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], lines


def test_help_lists_the_flags(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        launcher_parser(monkeypatch).parse_args(["--help"])
    assert exited.value.code == 0
    out = capsys.readouterr().out
    for flag in ("--mm-processor", "--mm-max-inflight", "--mm-sidecar-namespace", "--metrics-port"):
        assert flag in out


def test_the_real_launcher_exits_2_before_building_the_engine(tmp_path: Path) -> None:
    """``python -m vllm.entrypoints.launchers.grpc_server`` (``vllm.entrypoints.grpc_server``
    before 0.30) loads the plugin through its entry point (no test monkeypatching): a bad value
    stops it at the parse."""
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            releases.launcher_module(),
            "--model",
            str(tmp_path),
            "--mm-max-item-bytes",
            "lots",
        ],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert result.returncode == 2, result.stderr[-2000:]
    last = result.stderr.strip().splitlines()[-1]
    assert "error: --mm-max-item-bytes: invalid value 'lots': invalid literal for int()" in last


def test_the_parser_is_wrapped_once() -> None:
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    wrapped = FlexibleArgumentParser.parse_known_args
    plugin.register()
    assert FlexibleArgumentParser.parse_known_args is wrapped
    assert isinstance(argparse.ArgumentParser.parse_known_args, types.FunctionType)


def test_the_keepalive_options_of_old_launchers_are_fixed() -> None:
    """vLLM 0.19-0.30's launcher options (the ping interval misspelt, so grpc ignores it; no
    strike setting): the plugin adds what 0.31+ sets, and keeps what a launcher already set."""
    old = [
        ("grpc.max_send_message_length", -1),
        ("grpc.max_receive_message_length", -1),
        ("grpc.http2.min_recv_ping_interval_without_data_ms", 10000),
        ("grpc.keepalive_permit_without_calls", True),
    ]
    fixed = dict(plugin.keepalive_options(old))
    assert fixed["grpc.http2.max_ping_strikes"] == 0
    assert fixed["grpc.http2.min_ping_interval_without_data_ms"] == 10_000
    assert fixed["grpc.keepalive_permit_without_calls"] is True  # the launcher's own value
    new = [("grpc.http2.max_ping_strikes", 0), ("grpc.http2.min_ping_interval_without_data_ms", 5)]
    assert dict(plugin.keepalive_options(new))["grpc.http2.min_ping_interval_without_data_ms"] == 5


def test_a_launcher_parse_fixes_keepalive_on_every_server(monkeypatch: pytest.MonkeyPatch) -> None:
    built: list[Any] = []

    def server(*args: Any, **kwargs: Any) -> str:
        built.append(kwargs.get("options"))
        return "server"

    monkeypatch.setattr(grpc.aio, "server", server)
    launcher_parser(monkeypatch).parse_args(["--model", MODEL])
    assert grpc.aio.server(options=[("grpc.max_send_message_length", -1)]) == "server"
    assert ("grpc.http2.max_ping_strikes", 0) in built[-1]
    plugin.fix_keepalive()  # idempotent: one wrapper
    grpc.aio.server()
    assert len(built) == 2 and ("grpc.http2.max_ping_strikes", 0) in built[-1]


# TLS through the plugin: `vllm serve --grpc` reads vLLM's own --ssl-* flags, the launcher module
# gains them, SMG_SERVICER_SSL_* is the fallback, a bad file exits 2 with one line at the parse,
# and vLLM's add_insecure_port binds a TLS-only port. The whole launcher over mutual TLS, through
# the router, is tests-integration's test_tls_and_shutdown.


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> MutualTls:
    return mutual_tls(tmp_path_factory.mktemp("pki"))


def test_vllm_serve_grpc_reads_vllms_own_ssl_flags(pki: MutualTls) -> None:
    serve_parser().parse_args(["serve", MODEL, "--grpc", *pki.server_flags()])
    launch = plugin.launcher_settings()
    assert launch is not None and launch.tls is not None
    assert launch.tls.client_ca == pki.ca.cert.read_bytes()
    assert launch.tls.describe().startswith("mutual TLS")


def test_the_launcher_module_gains_the_ssl_flags_and_the_margin(
    pki: MutualTls, monkeypatch: pytest.MonkeyPatch
) -> None:
    args = launcher_parser(monkeypatch).parse_args(
        ["--model", MODEL, *pki.server_flags(), "--shutdown-margin", "4"]
    )
    assert args.ssl_certfile == str(pki.server[0])
    launch = plugin.launcher_settings()
    assert launch is not None and launch.tls is not None and launch.shutdown_margin_s == 4.0


def test_the_stop_deadline_covers_vllms_own_shutdown_timeout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """vLLM 0.34's launcher drains for ``--shutdown-timeout`` (vLLM's own flag) before it tears the
    engine down: the deadline the health servicer arms waits for that, then the margin."""
    launcher_parser(monkeypatch).parse_args(
        ["--model", MODEL, "--shutdown-timeout", "40", "--shutdown-margin", "3"]
    )
    launch = plugin.launcher_settings()
    assert launch is not None and launch.shutdown_timeout_s == 40.0
    monkeypatch.setattr(plugin, "in_launcher_process", lambda: True)
    deadline = plugin.shutdown_deadline()
    assert deadline is not None
    assert (
        (deadline.grace_s, deadline.margin_s) == (releases.launcher_stop_s(40), 3.0) == (50.0, 3.0)
    )


def test_the_variables_are_the_fallback(pki: MutualTls, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SMG_SERVICER_SSL_CERTFILE", str(pki.server[0]))
    monkeypatch.setenv("SMG_SERVICER_SSL_KEYFILE", str(pki.server[1]))
    launcher_parser(monkeypatch).parse_args(["--model", MODEL])
    launch = plugin.launcher_settings()
    assert launch is not None and launch.tls is not None and launch.tls.client_ca is None


def test_no_tls_flag_leaves_the_port_plain(monkeypatch: pytest.MonkeyPatch) -> None:
    launcher_parser(monkeypatch).parse_args(["--model", MODEL])
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
        launcher_parser(monkeypatch).parse_args(
            ["--model", MODEL, "--ssl-certfile", str(pki.server[0]), "--ssl-keyfile", str(missing)]
        )
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

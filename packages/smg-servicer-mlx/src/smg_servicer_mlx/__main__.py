"""``python -m smg_servicer_mlx --model DIR|ORG/NAME [--host H] [--port P] [...]`` (also the
facade's ``python -m smg_grpc_servicer.mlx``).

| flag | variable | default |
|---|---|---|
| ``--model`` | ``SMG_MLX_MODEL`` | (required) local model directory, or a Hugging Face id (1) |
| ``--completion-batch-size`` | ``SMG_MLX_COMPLETION_BATCH_SIZE`` | 32 |
| ``--prefill-batch-size`` | ``SMG_MLX_PREFILL_BATCH_SIZE`` | 8 |
| ``--prefill-step-size`` | ``SMG_MLX_PREFILL_STEP_SIZE`` | 2048 |
| ``--max-queue`` | ``SMG_MLX_MAX_QUEUE`` | 256 (may wait beyond the batch) |
| ``--adapter-path`` | ``SMG_MLX_ADAPTER_PATH`` | none (LoRA adapter directory) |

(1) resolved through the Hugging Face cache as mlx-lm does, downloaded unless ``HF_HUB_OFFLINE``
is set; ``GetTokenizer`` bundles the same snapshot.

plus core's server flags (``--host``, ``--port``, ``--grace-period``, ``--max-message-mb``,
``--log-level``, ``--shutdown-margin``, TLS: ``--ssl-certfile``, ``--ssl-keyfile``,
``--ssl-ca-certs``, ``--ssl-keyfile-password``, see ``smg_servicer_core.tls``) and metrics
flags (``--metrics-port`` / ``SMG_MLX_SERVICER_METRICS_PORT``,
``--metrics-host`` / ``SMG_MLX_SERVICER_METRICS_HOST``; off by default) and request spans that
continue the router's trace (``--otlp-traces-endpoint`` / ``SMG_MLX_SERVICER_OTLP_TRACES_ENDPOINT``,
an OTLP gRPC collector; off by default; ``smg_servicer_core.tracing``).
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path
from typing import Any

from smg_servicer_core import hf_cache
from smg_servicer_core.cli import (
    resolve_server,
    server_options,
    server_parser,
    start_metrics,
    tracing_from,
)
from smg_servicer_core.config import Setting, at_least, environment, resolve
from smg_servicer_core.entry import configure_logging, run_main
from smg_servicer_core.errors import ConfigError
from smg_servicer_core.health import HealthFrame
from smg_servicer_core.server import serve
from smg_servicer_mlx.model_info import read_model_info

logger = logging.getLogger("smg_servicer_mlx")


def _model_dir(value: str) -> str | None:
    if not value:
        return "is required (a local model directory or a Hugging Face id)"
    if Path(value).is_dir():
        return None if (Path(value) / "config.json").is_file() else "has no config.json"
    if hf_cache.is_repo_id(value):
        return None  # resolved through the Hugging Face cache at start-up
    return "is neither a model directory nor a Hugging Face id"


MLX_SETTINGS: tuple[Setting[Any], ...] = (
    Setting(
        "model",
        str,
        "",
        "model directory or Hugging Face id",
        flag="--model",
        env="SMG_MLX_MODEL",
        validate=_model_dir,
    ),
    Setting(
        "completion_batch_size",
        int,
        32,
        "sequences decoded together",
        flag="--completion-batch-size",
        env="SMG_MLX_COMPLETION_BATCH_SIZE",
        validate=at_least(1),
    ),
    Setting(
        "prefill_batch_size",
        int,
        8,
        "prompts prefilled together",
        flag="--prefill-batch-size",
        env="SMG_MLX_PREFILL_BATCH_SIZE",
        validate=at_least(1),
    ),
    Setting(
        "prefill_step_size",
        int,
        2048,
        "prefill chunk (tokens)",
        flag="--prefill-step-size",
        env="SMG_MLX_PREFILL_STEP_SIZE",
        validate=at_least(1),
    ),
    Setting(
        "max_queue",
        int,
        256,
        "admission queue depth",
        flag="--max-queue",
        env="SMG_MLX_MAX_QUEUE",
        validate=at_least(1),
    ),
    Setting(
        "adapter_path",
        str,
        "",
        "LoRA adapter directory",
        flag="--adapter-path",
        env="SMG_MLX_ADAPTER_PATH",
    ),
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m smg_servicer_mlx",
        description="SMG gRPC servicer for MLX",
        parents=[server_parser("mlx")],
    )
    group = parser.add_argument_group("mlx")
    for setting in MLX_SETTINGS:
        setting.add_to_parser(group)
    return parser


async def _main(args: argparse.Namespace) -> int:
    server = resolve_server(args, environment(), "mlx")
    options = server_options(server)  # reads the TLS files: a bad one is exit 2, one line
    configure_logging(server["log_level"])
    mlx = resolve(MLX_SETTINGS, args, environment())
    logger.info("settings: %s; %s", server.describe(), mlx.describe())
    tracing = tracing_from(server, "smg-servicer-mlx")  # a missing SDK: exit 2, before the model
    model_dir = hf_cache.resolve_model(mlx["model"])
    info = read_model_info(model_dir, name=mlx["model"])
    try:  # the engine is imported only now, so --help works without MLX
        from smg_servicer_mlx._engine import MlxEngine  # noqa: PLC0415
        from smg_servicer_mlx.servicer import SERVICE_NAME, MlxServicer  # noqa: PLC0415
    except ImportError as err:
        raise ConfigError(str(err)) from err
    engine = MlxEngine(
        info,
        completion_batch_size=mlx["completion_batch_size"],
        prefill_batch_size=mlx["prefill_batch_size"],
        prefill_step_size=mlx["prefill_step_size"],
        max_queue=mlx["max_queue"],
        adapter_path=mlx["adapter_path"] or None,
    )
    health = HealthFrame(SERVICE_NAME)
    metrics = start_metrics(server, tls=options.tls)  # /metrics has the gRPC port's TLS
    servicer = MlxServicer(engine, health, metrics=metrics[0] if metrics else None)
    servicer.attach_tracing(tracing)
    engine.start()
    return await serve(
        [servicer.binding()],
        health,
        engine,
        options,
        in_flight=lambda: len(servicer.registry),
        metrics_server=metrics[1] if metrics else None,
    )


def main() -> None:
    args = build_parser().parse_args()
    run_main(lambda: _main(args), "smg-servicer-mlx")


if __name__ == "__main__":
    main()

"""The generated SMG proto modules, imported in one place.

``smg-grpc-proto`` ships ``.pyi`` stubs for the message modules but none for the ``*_grpc``
modules, so the strict type check is relaxed for missing stubs here only.
"""
# pyright: reportMissingTypeStubs=false

from smg_grpc_proto.generated import (
    common_pb2,
    mlx_engine_pb2,
    mlx_engine_pb2_grpc,
    sglang_scheduler_pb2,
    sglang_scheduler_pb2_grpc,
    tokenspeed_encoder_pb2,
    tokenspeed_encoder_pb2_grpc,
    tokenspeed_scheduler_pb2,
    tokenspeed_scheduler_pb2_grpc,
    vllm_engine_pb2,
    vllm_engine_pb2_grpc,
)

__all__ = [
    "common_pb2",
    "mlx_engine_pb2",
    "mlx_engine_pb2_grpc",
    "sglang_scheduler_pb2",
    "sglang_scheduler_pb2_grpc",
    "tokenspeed_encoder_pb2",
    "tokenspeed_encoder_pb2_grpc",
    "tokenspeed_scheduler_pb2",
    "tokenspeed_scheduler_pb2_grpc",
    "vllm_engine_pb2",
    "vllm_engine_pb2_grpc",
]

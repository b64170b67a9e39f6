"""``smg_grpc_servicer.vllm.servicer.VllmEngineServicer`` (vLLM's gRPC launcher imports it)."""

from smg_grpc_servicer._delegate import load

_impl = load("vllm", "servicer")
VllmEngineServicer = _impl.VllmEngineServicer

__all__ = ["VllmEngineServicer"]

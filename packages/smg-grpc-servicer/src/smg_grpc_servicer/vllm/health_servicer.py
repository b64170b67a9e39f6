"""``smg_grpc_servicer.vllm.health_servicer.VllmHealthServicer`` (vLLM's gRPC launcher)."""

from smg_grpc_servicer._delegate import load

_impl = load("vllm", "health_servicer")
VllmHealthServicer = _impl.VllmHealthServicer

__all__ = ["VllmHealthServicer"]

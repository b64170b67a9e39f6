"""``smg_grpc_servicer.sglang.server.serve_grpc(server_args, model_info=None,
on_request_manager_ready=None)``, called by ``sglang serve --smg-grpc-mode``."""

from smg_grpc_servicer._delegate import load

_impl = load("sglang", "server")
serve_grpc = _impl.serve_grpc

__all__ = ["serve_grpc"]

"""``smg_grpc_servicer.vllm.plugin``: the vLLM general plugin, from smg-servicer-vllm.

``register`` adds the ``--mm-*`` and ``--metrics-*`` flags to vLLM's gRPC command lines;
``launcher_settings`` is what the last gRPC parse resolved. Importing it imports no vLLM.
"""

from smg_grpc_servicer._delegate import load

_impl = load("vllm", "plugin")
register = _impl.register
launcher_settings = _impl.launcher_settings

__all__ = ["launcher_settings", "register"]

"""``smg_grpc_servicer.vllm.rust``: the Rust servicer lane (``--servicer-impl rust``), from
smg-servicer-vllm's :mod:`smg_servicer_vllm.rust_lane`.

``require_upstream_hook`` is what ``smg serve --servicer-impl rust`` imports and calls before it
launches a worker: it raises RuntimeError, naming the fix, unless this interpreter's vLLM loads
our plugin (which selects the lane) and the ``smg`` wheel's Rust binding is installed.
"""

from smg_grpc_servicer._delegate import load

_impl = load("vllm", "rust_lane")
require_upstream_hook = _impl.require_upstream_hook
SERVICER_IMPL = _impl.SERVICER_IMPL

__all__ = ["SERVICER_IMPL", "require_upstream_hook"]

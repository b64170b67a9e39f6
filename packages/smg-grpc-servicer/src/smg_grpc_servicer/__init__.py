"""Compatibility facade for the import paths and commands engines already call.

| path engines / users call | provided by |
|---|---|
| ``smg_grpc_servicer.vllm.VllmEngineServicer``, ``.VllmHealthServicer`` | ``smg-servicer-vllm`` |
| ``smg_grpc_servicer.vllm.servicer``, ``.vllm.health_servicer`` | ``smg-servicer-vllm`` |
| ``smg_grpc_servicer.sglang.server.serve_grpc`` | ``smg-servicer-sglang`` |
| ``python -m smg_grpc_servicer.mlx`` (and ``.mlx.server``) | ``smg-servicer-mlx`` |
| ``python -m smg_grpc_servicer.tokenspeed`` | ``smg-servicer-tokenspeed`` |

Importing this package (or any engine subpackage) imports no engine; the engine package is loaded
when one of its names is first used. When it is not installed, an ImportError names the package to
install.
"""

from importlib.metadata import version as _version

__version__ = _version("smg-grpc-servicer")

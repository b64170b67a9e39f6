"""smg-servicer-mm-sidecar: the protocol of the GPU-free multimodal sidecar of SMG vLLM workers,
over Redis, and its two engine-free ends. Imports no engine and no other workspace package.

- :mod:`.protocol` — schema v1 (keys, messages, codes, fingerprint, namespace); msgspec only;
- :mod:`.client` — the worker's side (probe, submit); needs ``redis`` (the ``[redis]`` extra);
- :mod:`.service` — the sidecar's Redis loops around any job processor; needs ``redis``.

The sidecar process itself (vLLM's media connector and renderer behind :mod:`.service`) is
smg-servicer-vllm's: ``python -m smg_grpc_servicer.vllm.mm_sidecar``
(``pip install 'smg-grpc-servicer[vllm,vllm-redis]'``).
"""

__version__ = "0.2.0"

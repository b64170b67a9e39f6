"""The GPU-free multimodal sidecar of vLLM workers started with ``--mm-processor redis``.

``python -m smg_servicer_vllm.mm_sidecar`` (the facade's ``python -m
smg_grpc_servicer.vllm.mm_sidecar``) builds vLLM's configuration and renderer for the model (no
engine, no KV cache, no GPU) and serves the job list of its namespace over Redis. It needs vLLM
and the Redis client: ``pip install 'smg-servicer-vllm[vllm,redis]'`` (or the seed's ``pip install
'smg-grpc-servicer[vllm,vllm-redis]'``).

- :mod:`.settings` — its own settings (``--redis-url``, ``--namespace``, ``--concurrency``, the
  result cap), resolved as the worker's are; engine-free;
- :mod:`.process` — the process: its settings and Redis checked first (engine-free), then
  :mod:`.jobs` — vLLM's media connector and renderer behind smg-servicer-mm-sidecar's loops
  (:mod:`smg_servicer_mm_sidecar.service`) and protocol.

It lives in the worker's package because it is vLLM's processing, fingerprinted exactly as the
worker fingerprints its engine; smg-servicer-mm-sidecar keeps only the engine-free protocol,
client and loops, and imports nothing of this package.
"""

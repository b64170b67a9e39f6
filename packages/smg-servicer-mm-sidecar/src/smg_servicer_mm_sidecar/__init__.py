"""smg-servicer-mm-sidecar: the GPU-free multimodal sidecar of SMG vLLM workers, over Redis.

- :mod:`.protocol` — schema v1 (keys, messages, codes, fingerprint, namespace); msgspec only;
- :mod:`.client` — the worker's side (probe, submit); needs ``redis`` (the ``[redis]`` extra);
- :mod:`.service` — the sidecar's Redis loops, engine-free;
- :mod:`.sidecar` — the process (``python -m smg_servicer_mm_sidecar``); needs the ``[vllm]`` extra.
"""

__version__ = "0.1.0"

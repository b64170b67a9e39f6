"""``python -m smg_servicer_mm_sidecar``: the sidecar process (needs the ``[vllm]`` extra)."""

from smg_servicer_mm_sidecar.sidecar import main

if __name__ == "__main__":
    main()

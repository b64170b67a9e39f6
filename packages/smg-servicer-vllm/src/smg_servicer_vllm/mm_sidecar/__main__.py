"""``python -m smg_servicer_vllm.mm_sidecar`` (or the facade's
``python -m smg_grpc_servicer.vllm.mm_sidecar``): the sidecar process."""

from smg_servicer_vllm.mm_sidecar.process import main

if __name__ == "__main__":
    main()

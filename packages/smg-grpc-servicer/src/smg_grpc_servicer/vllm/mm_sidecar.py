"""``python -m smg_grpc_servicer.vllm.mm_sidecar``: the GPU-free multimodal sidecar of vLLM
workers started with ``--mm-processor redis`` (smg-servicer-vllm's ``mm_sidecar``; ``pip install
'smg-grpc-servicer[vllm,vllm-redis]'``). ``main(argv)`` runs it; importing this module imports
no engine."""

from collections.abc import Sequence

from smg_grpc_servicer._delegate import load


def main(argv: Sequence[str] | None = None) -> None:
    load("mm_sidecar", "mm_sidecar.process").main(argv)


if __name__ == "__main__":
    main()

"""``python -m smg_grpc_servicer.vllm.headless``: vLLM's headless engine cores for the router's
direct ZMQ lane (``smg launch --worker-urls ipc://… --backend vllm``); smg-servicer-vllm's
:mod:`smg_servicer_vllm.headless`."""

import sys

from smg_grpc_servicer._delegate import load

if __name__ == "__main__":
    sys.exit(load("vllm", "headless").main())

"""``python -m smg_grpc_servicer.sglang.headless``: SGLang's scheduler ranks headless for the
router's direct ZMQ lane (what ``smg serve --backend sglang --connection-mode zmq`` launches);
smg-servicer-sglang's :mod:`smg_servicer_sglang.headless`."""

import sys

from smg_grpc_servicer._delegate import load

if __name__ == "__main__":
    sys.exit(load("sglang", "headless").main())

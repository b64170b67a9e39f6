"""``python -m smg_grpc_servicer.tokenspeed.headless``: TokenSpeed's scheduler ranks headless for
the router's direct ZMQ lane (``smg launch --backend tokenspeed --worker-urls ipc://…``), drained
on SIGTERM and reported to the router when they die; smg-servicer-tokenspeed's
:mod:`smg_servicer_tokenspeed.headless`."""

import sys

from smg_grpc_servicer._delegate import load

if __name__ == "__main__":
    sys.exit(load("tokenspeed", "headless").main())

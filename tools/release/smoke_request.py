"""One greedy request against a worker, run with the Python of an environment installed from the
built wheels (it imports only what those wheels bring: grpcio and ``smg_servicer_core``, not core's
``testing.process``, whose psutil a plain MLX install lacks: hence its own health loop).

    python smoke_request.py --wire mlx --port 50051 [--timeout 240]

Waits (bounded) until the worker's ``grpc.health.v1`` reports SERVING, sends one tokenized
8-token greedy ``Generate`` and checks that it completes with 8 tokens. Prints one JSON line;
exit 0 on success, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from smg_servicer_core.testing.requests import STUBS, generate_request

MAX_TOKENS = 8


def wait_serving(channel: grpc.Channel, deadline: float) -> None:
    health: Any = health_pb2_grpc.HealthStub(channel)  # grpc_health's stub has no typed methods
    last = "no answer"
    while time.monotonic() < deadline:
        try:
            status = health.Check(health_pb2.HealthCheckRequest(), timeout=2).status
            if status == health_pb2.HealthCheckResponse.SERVING:
                return
            last = health_pb2.HealthCheckResponse.ServingStatus.Name(status)
        except grpc.RpcError as err:
            last = err.code().name
        time.sleep(0.2)
    raise TimeoutError(f"the worker never reported SERVING (last: {last})")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--wire", choices=sorted(STUBS), required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--timeout", type=float, default=240.0)
    args = parser.parse_args()
    started = time.monotonic()
    with grpc.insecure_channel(f"127.0.0.1:{args.port}") as channel:
        try:
            wait_serving(channel, started + args.timeout)
            ready_s = time.monotonic() - started
            stub = STUBS[args.wire](channel)
            request = generate_request(
                args.wire, [1, 2, 3, 4, 5], max_tokens=MAX_TOKENS, temperature=0.0
            )
            replies = list(stub.Generate(request, timeout=60))
        except (grpc.RpcError, TimeoutError) as err:
            print(json.dumps({"ok": False, "error": str(err)[:500]}))
            return 1
    completes = [r.complete for r in replies if r.HasField("complete")]
    ok = len(completes) == 1 and len(completes[0].output_ids) == MAX_TOKENS
    print(json.dumps({
        "ok": ok,
        "ready_s": round(ready_s, 2),
        "output_ids": list(completes[0].output_ids) if completes else [],
        "finish_reason": completes[0].finish_reason if completes else "",
    }))  # fmt: skip
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

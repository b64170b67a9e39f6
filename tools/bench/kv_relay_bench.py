"""KV-event relay benchmark: publisher -> bridge -> gRPC SubscribeKvEvents -> client.

Three processes. A publisher (the engine's wire: PUB, ``[topic, seq, msgpack]``) sends ``--rate``
events/s in batches of ``--events-per-batch`` for ``--seconds``; each payload carries its send
time. The vLLM servicer (over a fake engine whose KV-events config points at that publisher)
relays them; a gRPC client process subscribes and measures the events/s delivered and the
publisher-to-client latency. Prints one JSON line.

    uv run python tools/bench/kv_relay_bench.py --rate 10000 --events-per-batch 10 --seconds 5
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from smg_servicer_core.health import HealthFrame
from smg_servicer_core.proto import vllm_engine_pb2_grpc
from smg_servicer_core.server import ExternalEngine, ServiceBinding
from smg_servicer_core.testing import running_server
from smg_servicer_core.testing.process import spawn_with_port_file
from smg_servicer_vllm.servicer import SERVICE_NAME, VllmEngineServicer
from smg_servicer_vllm.testing import FakeAsyncLLM

PUBLISHER = """
import sys, time, zmq
from smg_servicer_kv_bridge.testing import stored_event
from smg_servicer_kv_bridge.wire import encode_batch, seq_bytes
port_file, rate = sys.argv[1], float(sys.argv[2])
per_batch, seconds = int(sys.argv[3]), float(sys.argv[4])
ctx = zmq.Context()
pub = ctx.socket(zmq.PUB); pub.setsockopt(zmq.SNDHWM, 0)
port = pub.bind_to_random_port("tcp://127.0.0.1")
open(port_file, "w").write(str(port))
time.sleep(1.5)  # let the relay subscribe
interval = per_batch / rate
seq, start = 0, time.perf_counter()
deadline = start + seconds
while time.perf_counter() < deadline:
    seq += 1
    events = [stored_event([seq * 100 + i], list(range(16))) for i in range(per_batch)]
    pub.send_multipart([b"", seq_bytes(seq), encode_batch(time.time(), events, 0)])
    target = start + seq * interval
    while (now := time.perf_counter()) < target:
        time.sleep(min(target - now, 0.001))
print(seq, flush=True)
time.sleep(0.5)
"""

CONSUMER = """
import asyncio, json, sys, time, grpc
from smg_servicer_core.proto import common_pb2, vllm_engine_pb2_grpc
async def main(port, idle_s):
    lat, events, first, last = [], 0, 0.0, 0.0
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        call = vllm_engine_pb2_grpc.VllmEngineStub(channel).SubscribeKvEvents(
            common_pb2.SubscribeKvEventsRequest())
        async def consume():
            nonlocal events, first, last
            while (batch := await call.read()) is not grpc.aio.EOF:
                if batch.load.load_only or not batch.events:
                    continue
                now = time.time(); first = first or now; last = now
                events += len(batch.events); lat.append(now - batch.timestamp)
        task = asyncio.create_task(consume())
        while not first or time.time() - last < idle_s:
            await asyncio.sleep(0.1)
        call.cancel()
        await asyncio.gather(task, return_exceptions=True)
    print(json.dumps({"events": events, "first": first, "last": last, "lat": lat}))
asyncio.run(main(int(sys.argv[1]), float(sys.argv[2])))
"""


async def run(args: argparse.Namespace, publisher_port: int) -> dict[str, Any]:
    engine = FakeAsyncLLM()
    engine.vllm_config.kv_events_config = SimpleNamespace(  # type: ignore[attr-defined]
        enable_kv_cache_events=True,
        publisher="zmq",
        endpoint=f"tcp://127.0.0.1:{publisher_port}",
        replay_endpoint=None,
        topic="",
        hwm=1_000_000,
    )
    servicer = VllmEngineServicer(engine, 0.0)

    def register(server: Any) -> None:
        vllm_engine_pb2_grpc.add_VllmEngineServicer_to_server(servicer, server)

    binding = ServiceBinding(SERVICE_NAME, register)
    async with running_server([binding], HealthFrame("x"), ExternalEngine()) as server:
        consumer = await asyncio.create_subprocess_exec(
            sys.executable, "-c", CONSUMER, str(server.port), "2.0", stdout=asyncio.subprocess.PIPE
        )
        out, _ = await asyncio.wait_for(consumer.communicate(), args.seconds + 60)
    result = json.loads(out)
    events, first, last = result["events"], result["first"], result["last"]
    q = statistics.quantiles(result["lat"], n=100, method="inclusive")
    return {
        "label": "kv-relay",
        "rate_target_events_per_s": args.rate,
        "events_per_batch": args.events_per_batch,
        "events_delivered": events,
        "relay_events_per_s": round(events / (last - first), 1) if last > first else 0.0,
        "latency_ms_p50": round(q[49] * 1000, 3),
        "latency_ms_p99": round(q[98] * 1000, 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rate", type=float, default=10_000.0, help="events per second")
    parser.add_argument("--events-per-batch", type=int, default=10)
    parser.add_argument("--seconds", type=float, default=5.0)
    args = parser.parse_args()
    port_file = Path(tempfile.mkdtemp()) / "port"
    command = [
        sys.executable,
        "-c",
        PUBLISHER,
        str(port_file),
        str(args.rate),
        str(args.events_per_batch),
        str(args.seconds),
    ]
    publisher, port = spawn_with_port_file(command, port_file)
    try:
        report = asyncio.run(run(args, port))
    finally:
        out = publisher.communicate(timeout=args.seconds + 30)[0] or b""
    sent = int(out.decode().strip().splitlines()[-1]) * args.events_per_batch
    print(json.dumps({**report, "events_sent": sent}))


if __name__ == "__main__":
    main()

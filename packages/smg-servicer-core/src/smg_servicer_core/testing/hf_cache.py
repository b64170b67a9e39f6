"""A Hugging Face cache entry built locally from a model directory, laid out exactly as
huggingface_hub writes one, for offline tests of ``--model org/name``:

    <cache>/models--org--name/blobs/<sha256 of the file>
    <cache>/models--org--name/snapshots/<revision>/<file> -> ../../blobs/<sha256>
    <cache>/models--org--name/refs/main                       (the revision)
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path


def add_to_hf_cache(model_dir: Path, cache: Path, repo_id: str, revision: str = "0" * 40) -> Path:
    """Put ``model_dir``'s files under ``repo_id`` in ``cache``; the snapshot directory."""
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    snapshot = repo / "snapshots" / revision
    (repo / "blobs").mkdir(parents=True, exist_ok=True)
    snapshot.mkdir(parents=True, exist_ok=True)
    for source in sorted(p for p in model_dir.iterdir() if p.is_file()):
        data = source.read_bytes()
        blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
        if not blob.exists():
            blob.write_bytes(data)
        link = snapshot / source.name
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(os.path.relpath(blob, snapshot))
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text(revision)
    return snapshot

"""TokenSpeed's runtime pins its own forks of the servicer and the proto, which write the same
import packages as ours; this module finds the overlap and says the command that resolves it.

TokenSpeed 0.1.1 requires ``tokenspeed-smg-grpc-servicer==0.9.1.post20260920`` and
``tokenspeed-smg-grpc-proto==0.4.18.post20260920`` (exact pins). They install
``smg_grpc_servicer/`` and ``smg_grpc_proto/``, the import packages of ``smg-grpc-servicer``
(ours) and ``smg-grpc-proto``. The seed's TokenSpeed line (``pip install smg-grpc-servicer`` after
the runtime) therefore overwrites the forks' files: ``ts serve`` then runs our servicer, but pip's
records disagree (the forks' RECORD still lists files that are now ours, so uninstalling a fork
later deletes our files, and reinstalling one puts its files back over ours). No metadata of ours
can satisfy an exact pin on a fork's name, so pip cannot be made to do it; the servicer says so at
start, once, with :data:`FIX` (the README's TokenSpeed section says the same).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from importlib import metadata

#: fork distribution -> the distribution of ours that writes the same import package
FORKS = {
    "tokenspeed-smg-grpc-servicer": "smg-grpc-servicer",
    "tokenspeed-smg-grpc-proto": "smg-grpc-proto",
}
#: Leaves every file owned by one distribution: the forks go (their files with them, ours that
#: they overwrote included), then ours are written again, without touching their dependencies.
FIX = (
    "pip uninstall -y tokenspeed-smg-grpc-servicer tokenspeed-smg-grpc-proto && "
    "pip install --force-reinstall --no-deps smg-grpc-servicer smg-grpc-proto"
)


def _recorded(name: str, path: Sequence[str] | None) -> set[str] | None:
    """The files distribution ``name`` records (RECORD), or None when it is not installed."""
    if path is None:
        found = list(metadata.distributions(name=name))
    else:
        found = list(metadata.distributions(name=name, path=list(path)))
    if not found:
        return None
    return {str(file) for dist in found for file in (dist.files or ())}


def shared_files(path: Sequence[str] | None = None) -> dict[str, set[str]]:
    """fork -> the files both it and our distribution record (installed forks only): the files
    pip's records disagree on. ``path``: where to look (``sys.path`` by default)."""
    shared: dict[str, set[str]] = {}
    for fork, ours in FORKS.items():
        theirs = _recorded(fork, path)
        mine = _recorded(ours, path)
        if theirs is None or mine is None:
            continue
        common = {f for f in theirs & mine if not f.endswith((".dist-info/RECORD", "INSTALLER"))}
        if common:
            shared[fork] = common
    return shared


def notice(shared: dict[str, set[str]]) -> str | None:
    """One line for the log when a fork shares files with ours; None when none does."""
    if not shared:
        return None
    forks = ", ".join(f"{fork} ({len(files)} files)" for fork, files in sorted(shared.items()))
    return (
        f"pip's records overlap: {forks} also claim the files of "
        f"{_names(FORKS[f] for f in sorted(shared))}, which now hold ours (installing this "
        f"servicer over TokenSpeed's runtime overwrote them; uninstalling a fork would delete "
        f"ours). To leave each file owned by one distribution: {FIX}"
    )


def _names(names: Iterable[str]) -> str:
    return " and ".join(names)

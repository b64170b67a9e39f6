"""Publisher endpoints as engines configure them -> addresses a subscriber can dial.

Engines (vLLM, SGLang) bind each DP rank's publisher on the configured port plus the rank, and a
wildcard bind (``tcp://*:5557``) is reachable on loopback from the same node.
"""

from __future__ import annotations

import re

_WILDCARDS = (
    ("tcp://*:", "tcp://127.0.0.1:"),
    ("tcp://0.0.0.0:", "tcp://127.0.0.1:"),
    ("tcp://[::]:", "tcp://[::1]:"),
)
_PORT = re.compile(r":(\d+)$")


def dialable(endpoint: str) -> str:
    """A wildcard bind address -> its loopback address; anything else unchanged."""
    for wildcard, loopback in _WILDCARDS:
        if endpoint.startswith(wildcard):
            return loopback + endpoint[len(wildcard) :]
    return endpoint


def offset(endpoint: str, rank: int) -> str:
    """The endpoint DP rank ``rank`` binds: the TCP port plus the rank (IPC paths unchanged)."""
    match = _PORT.search(endpoint)
    if rank == 0 or match is None or not endpoint.startswith("tcp://"):
        return endpoint
    return endpoint[: match.start(1)] + str(int(match.group(1)) + rank)

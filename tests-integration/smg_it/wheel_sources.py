"""A published wheel's Python sources, read without installing or importing it.

The wheel's members come from :mod:`smg_it.wheel_fetch` (:class:`WheelSources`: the package
index, HTTP Range requests, a cache folder; re-exported here).

:class:`SourceTree` answers questions about the sources by ``ast`` alone: does a module exist,
what does ``from m import n`` bind (re-exports followed: ``from .x import Y``, ``import a.b as c``,
star imports, a lazy module ``__getattr__`` table such as ``MODULE_ATTRS`` or
``environment_variables``; ``if TYPE_CHECKING:`` blocks are not run, so they bind nothing), the
members of a class (its body, ``self.x = ...`` in its methods, then its bases: those in the wheel
by their sources, the standard library's by importing them), and the signature of a function or
constructor as :class:`inspect.Signature` (``super().__init__(*args, **kwargs)`` followed; a
dataclass-like class without ``__init__`` takes its fields).
"""

from __future__ import annotations

import ast
import builtins
import contextlib
import importlib
import inspect
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from smg_it.wheel_fetch import (
    MANYLINUX_X86_64,
    RangeFile,
    Wheel,
    WheelSources,
    WheelUnavailable,
    find_wheel,
    write_atomically,
)

__all__ = [
    "MANYLINUX_X86_64", "RangeFile", "Wheel", "WheelSources", "WheelUnavailable", "find_wheel",
    "write_atomically",
]  # fmt: skip


# The sources, by ast ---------------------------------------------------------------------------

#: What a name is bound to.
MODULE, CLASS, FUNCTION, VALUE, EXTERNAL = "module", "class", "function", "value", "external"


@dataclass(frozen=True)
class Symbol:
    """A name's binding: a module of the wheel (``module`` is its dotted name, ``name`` empty),
    a class, function or value defined in ``module`` (``node`` its definition or value), or
    something outside the wheel (``module`` the external module, ``name`` the attribute or
    empty)."""

    kind: str
    module: str
    name: str = ""
    node: ast.AST | None = field(default=None, compare=False, repr=False)

    @property
    def where(self) -> str:
        return f"{self.module}.{self.name}" if self.name else self.module


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _runtime_statements(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    """A module's statements that run on import, blocks flattened (``if TYPE_CHECKING:`` bodies
    left out, ``try`` bodies before their handlers)."""
    for statement in body:
        if isinstance(statement, ast.If):
            if not _is_type_checking(statement.test):
                yield from _runtime_statements(statement.body)
            yield from _runtime_statements(statement.orelse)
        elif isinstance(statement, ast.Try | ast.TryStar):
            yield from _runtime_statements(statement.body)
            yield from _runtime_statements(statement.orelse)
            yield from _runtime_statements(statement.finalbody)
            for handler in statement.handlers:
                yield from _runtime_statements(handler.body)
        elif isinstance(statement, ast.With | ast.AsyncWith):
            yield from _runtime_statements(statement.body)
        else:
            yield statement


def _decorator_names(node: ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) -> set[str]:
    names: set[str] = set()
    for decorator in node.decorator_list:
        target = decorator.func if isinstance(decorator, ast.Call) else decorator
        if isinstance(target, ast.Name):
            names.add(target.id)
        elif isinstance(target, ast.Attribute):
            names.add(target.attr)
    return names


_KINDS = inspect.Parameter


class _Default:
    """A parameter's default as the sources give it: not evaluated (shown as ``...``)."""

    def __repr__(self) -> str:
        return "..."


DEFAULT = _Default()
#: Bases (outside the wheel) whose subclasses take their annotated fields as constructor keywords.
FIELD_BASES = {"Struct", "TypedDict", "NamedTuple", "BaseModel"}


class SourceTree:
    """Questions about one wheel's Python sources, answered from ``ast`` (see the module)."""

    def __init__(self, sources: WheelSources) -> None:
        self.sources = sources
        self._parsed: dict[str, ast.Module | None] = {}
        self._tops: set[str] | None = None

    # modules

    def module_file(self, module: str) -> str | None:
        """The member holding ``module`` (``a/b.py`` or ``a/b/__init__.py``), or None."""
        path = module.replace(".", "/")
        for member in (f"{path}.py", f"{path}/__init__.py"):
            if member in self.sources.names():
                return member
        return None

    def has_module(self, module: str) -> bool:
        return self.module_file(module) is not None

    def parse(self, module: str) -> ast.Module | None:
        if module not in self._parsed:
            member = self.module_file(module)
            text = self.sources.read(member) if member else None
            self._parsed[module] = None if text is None else ast.parse(text, member or module)
        return self._parsed[module]

    def _is_package(self, module: str) -> bool:
        return (self.module_file(module) or "").endswith("/__init__.py")

    def _absolute(self, module: str, imported: str | None, level: int) -> str:
        if not level:
            return imported or ""
        parts = module.split(".")
        keep = len(parts) - level + (1 if self._is_package(module) else 0)
        base = ".".join(parts[:keep])
        return f"{base}.{imported}" if imported else base

    def _in_wheel(self, module: str) -> bool:
        if self._tops is None:
            self._tops = {name.split("/", 1)[0] for name in self.sources.names() if "/" in name}
        return module.split(".", 1)[0] in self._tops

    def _module_symbol(self, module: str) -> Symbol:
        return Symbol(MODULE if self.has_module(module) else EXTERNAL, module)

    # names

    def lookup(self, module: str, name: str) -> Symbol | None:
        """What ``from module import name`` gives: None when nothing binds it."""
        return self._lookup(module, name, set())

    def _lookup(self, module: str, name: str, seen: set[tuple[str, str]]) -> Symbol | None:
        if (module, name) in seen:
            return None
        seen.add((module, name))
        if not self._in_wheel(module):
            return Symbol(EXTERNAL, module, name)
        tree = self.parse(module)
        if tree is None:
            return None
        found = self._bound(module, tree, name, seen)
        if found is None:
            found = self._lazy(module, tree, name, seen)
        if found is None and self.has_module(f"{module}.{name}"):
            found = Symbol(MODULE, f"{module}.{name}")
        return found

    def _bound(
        self, module: str, tree: ast.Module, name: str, seen: set[tuple[str, str]]
    ) -> Symbol | None:
        for statement in _runtime_statements(tree.body):
            found = _definition(statement, module, name)
            if found is not None:
                return found
            if isinstance(statement, ast.Import):
                for alias in statement.names:
                    if alias.asname == name:
                        return self._module_symbol(alias.name)
                    if alias.asname is None and alias.name.split(".")[0] == name:
                        return self._module_symbol(name)
            elif isinstance(statement, ast.ImportFrom):
                source = self._absolute(module, statement.module, statement.level)
                for alias in statement.names:
                    if alias.name == "*" and name in self._public(source):
                        return self._lookup(source, name, seen)
                    if (alias.asname or alias.name) == name:
                        return self._lookup(source, alias.name, seen)
        return None

    def _public(self, module: str) -> set[str]:
        """The names ``from module import *`` binds (its ``__all__`` when it lists one)."""
        tree = self.parse(module) if self._in_wheel(module) else None
        if tree is None:
            return set()
        names: set[str] = set()
        for statement in _runtime_statements(tree.body):
            if isinstance(statement, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "__all__" for t in statement.targets
            ):
                with contextlib.suppress(ValueError):
                    return {str(n) for n in ast.literal_eval(statement.value)}
            if isinstance(statement, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                names.add(statement.name)
            elif isinstance(statement, ast.Assign):
                names |= {t.id for t in statement.targets if isinstance(t, ast.Name)}
            elif isinstance(statement, ast.ImportFrom):
                names |= {a.asname or a.name for a in statement.names if a.name != "*"}
        return {n for n in names if not n.startswith("_")}

    def _lazy(
        self, module: str, tree: ast.Module, name: str, seen: set[tuple[str, str]]
    ) -> Symbol | None:
        """A name a module-level ``__getattr__`` serves from a dict it tests ``name in``: a
        ``"module:attr"`` value is followed (vLLM's ``MODULE_ATTRS``), anything else is a value
        (vLLM's ``envs.environment_variables``)."""
        getter = next(
            (
                s
                for s in _runtime_statements(tree.body)
                if isinstance(s, ast.FunctionDef) and s.name == "__getattr__"
            ),
            None,
        )
        if getter is None:
            return None
        tables = {
            comparator.id
            for node in ast.walk(getter)
            if isinstance(node, ast.Compare) and any(isinstance(o, ast.In) for o in node.ops)
            for comparator in node.comparators
            if isinstance(comparator, ast.Name)
        }
        for statement in _runtime_statements(tree.body):
            targets = (
                statement.targets
                if isinstance(statement, ast.Assign)
                else [statement.target]
                if isinstance(statement, ast.AnnAssign)
                else []
            )
            value = getattr(statement, "value", None)
            if not isinstance(value, ast.Dict) or not any(
                isinstance(t, ast.Name) and t.id in tables for t in targets
            ):
                continue
            for key, entry in zip(value.keys, value.values, strict=True):
                if not (isinstance(key, ast.Constant) and key.value == name):
                    continue
                target = entry.value if isinstance(entry, ast.Constant) else None
                if isinstance(target, str) and ":" in target:
                    path, attr = target.split(":", 1)
                    level = len(path) - len(path.lstrip("."))
                    source = self._absolute(module, path.lstrip(".") or None, level)
                    return self._lookup(source, attr, seen)
                return Symbol(VALUE, module, name, entry)
        return None

    def resolve(self, dotted: str) -> Symbol | None:
        """``a.b.C.d``: the longest prefix that is a module of the wheel, then names in it and
        members of classes."""
        parts = dotted.split(".")
        for cut in range(len(parts), 0, -1):
            module = ".".join(parts[:cut])
            if not self.has_module(module):
                continue
            symbol: Symbol | None = Symbol(MODULE, module)
            for part in parts[cut:]:
                symbol = self.attribute(symbol, part) if symbol is not None else None
            return symbol
        return None

    def attribute(self, symbol: Symbol, name: str) -> Symbol | None:
        if symbol.kind == MODULE:
            return self.lookup(symbol.module, name)
        if symbol.kind == CLASS:
            return self.member(symbol, name)
        cls = self.instance_class(symbol)
        return self.member(cls, name) if cls is not None else None

    def _resolve_expression(self, module: str, expression: ast.expr) -> Symbol | None:
        """A name or dotted name as ``module``'s code sees it."""
        if isinstance(expression, ast.Subscript):  # Generic[T], UserDict[str, X]
            return self._resolve_expression(module, expression.value)
        found: Symbol | None = None
        if isinstance(expression, ast.Name):
            found = self.lookup(module, expression.id)
            if found is None and hasattr(builtins, expression.id):
                found = Symbol(EXTERNAL, "builtins", expression.id)
        elif isinstance(expression, ast.Attribute):
            owner = self._resolve_expression(module, expression.value)
            if owner is not None and owner.kind == EXTERNAL:
                found = Symbol(EXTERNAL, owner.module, _dotted(owner.name, expression.attr))
            elif owner is not None:
                found = self.attribute(owner, expression.attr)
        return found

    def instance_class(self, symbol: Symbol) -> Symbol | None:
        """The class of a module-level instance (``X = SomeClass(...)``)."""
        if symbol.kind == VALUE and isinstance(symbol.node, ast.Call):
            found = self._resolve_expression(symbol.module, symbol.node.func)
            return found if found is not None and found.kind == CLASS else None
        return None

    # classes

    def bases(self, cls: Symbol) -> list[Symbol]:
        """``cls``'s bases as its module sees them (unresolvable ones left out)."""
        assert isinstance(cls.node, ast.ClassDef)
        found = [self._resolve_expression(cls.module, base) for base in cls.node.bases]
        return [b for b in found if b is not None]

    def mro(self, cls: Symbol) -> list[Symbol]:
        """``cls`` and its bases, depth first, each once (external bases included, not
        expanded)."""
        order: list[Symbol] = []
        pending = [cls]
        while pending:
            current = pending.pop(0)
            if current in order:
                continue
            order.append(current)
            if current.kind == CLASS:
                pending[0:0] = self.bases(current)
        return order

    def member(self, cls: Symbol, name: str) -> Symbol | None:
        """``cls.name``: its body (methods, fields, constants), ``self.name = ...`` in its
        methods, then its bases (the standard library's by importing them)."""
        for current in self.mro(cls):
            if current.kind == EXTERNAL:
                if _external_has(current, name):
                    return Symbol(EXTERNAL, current.module, _dotted(current.name, name))
                continue
            found = _own_member(current, name)
            if found is not None:
                return found
        return None

    def external_bases(self, cls: Symbol) -> list[str]:
        """The bases outside the wheel that are not the standard library's (their members
        cannot be read here)."""
        return [
            s.where
            for s in self.mro(cls)
            if s.kind == EXTERNAL and s.module.split(".")[0] not in sys.stdlib_module_names
        ]

    # signatures

    def signature(self, function: Symbol) -> inspect.Signature:
        """A function's or method's parameters (a method's first left out unless it is a
        ``staticmethod``); ``**kwargs`` passed on to ``super().__init__`` is replaced by the
        base's parameters."""
        node = function.node
        if function.kind == EXTERNAL:
            value = _external_object(function)
            signature = inspect.signature(value)
            if "." in function.name and inspect.isfunction(value):  # a method, read unbound
                signature = signature.replace(parameters=list(signature.parameters.values())[1:])
            return signature
        assert isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef), function
        method = function.name.count(".") > 0 and "staticmethod" not in _decorator_names(node)
        return _signature(node.args, drop_first=method)

    def constructor(self, cls: Symbol) -> inspect.Signature:
        """What ``cls(...)`` takes: the first ``__init__`` along its bases, or, for a dataclass,
        ``msgspec.Struct``, ``TypedDict``, ``NamedTuple`` or pydantic model without one, its
        annotated fields (every one by keyword)."""
        for current in self.mro(cls):
            if current.kind == EXTERNAL:
                if current.name in FIELD_BASES:
                    return self._fields_signature(cls)
                return inspect.signature(_external_object(current))
            assert isinstance(current.node, ast.ClassDef)
            init = _own_member(current, "__init__")
            if init is not None and init.kind == FUNCTION:
                signature = self.signature(init)
                return self._with_super(current, init, signature)
            if _decorator_names(current.node) & {"dataclass", "config"}:
                return self._fields_signature(cls)
        return inspect.Signature([])

    def _with_super(
        self, owner: Symbol, init: Symbol, signature: inspect.Signature
    ) -> inspect.Signature:
        parameters = list(signature.parameters.values())
        if not parameters or parameters[-1].kind != _KINDS.VAR_KEYWORD:
            return signature
        assert isinstance(init.node, ast.FunctionDef | ast.AsyncFunctionDef)
        if not _forwards_to_super(init.node, parameters[-1].name):
            return signature
        bases = self.bases(owner)
        if not bases:
            return signature
        inherited = (
            self.constructor(bases[0])
            if bases[0].kind == CLASS
            else inspect.signature(_external_object(bases[0]))
        )
        own = {p.name for p in parameters}
        extra = [  # by keyword; never required here (``*args`` may have given it)
            p.replace(kind=_KINDS.KEYWORD_ONLY, default=DEFAULT)
            for p in inherited.parameters.values()
            if p.kind in (_KINDS.POSITIONAL_OR_KEYWORD, _KINDS.KEYWORD_ONLY) and p.name not in own
        ]
        keyword_only = [p for p in parameters[:-1] if p.kind == _KINDS.KEYWORD_ONLY]
        positional = [p for p in parameters[:-1] if p.kind != _KINDS.KEYWORD_ONLY]
        return inspect.Signature([*positional, *keyword_only, *extra, parameters[-1]])

    def _fields_signature(self, cls: Symbol) -> inspect.Signature:
        """Every annotated field of ``cls`` and its bases, by keyword; required when it has no
        value (and is not ``NotRequired`` or in a ``total=False`` class)."""
        fields: dict[str, bool] = {}
        for current in reversed(self.mro(cls)):
            if current.kind != CLASS or not isinstance(current.node, ast.ClassDef):
                continue
            optional = any(
                k.arg == "total" and isinstance(k.value, ast.Constant) and k.value.value is False
                for k in current.node.keywords
            )
            for statement in current.node.body:
                if not isinstance(statement, ast.AnnAssign) or not isinstance(
                    statement.target, ast.Name
                ):
                    continue
                annotation = ast.unparse(statement.annotation)
                if "ClassVar" in annotation or statement.target.id.startswith("_"):
                    continue
                fields[statement.target.id] = not (
                    optional or statement.value is not None or "NotRequired" in annotation
                )
        return inspect.Signature(
            [
                _KINDS(name, _KINDS.KEYWORD_ONLY, default=_KINDS.empty if required else DEFAULT)
                for name, required in fields.items()
            ]
        )


def _definition(statement: ast.stmt, module: str, name: str) -> Symbol | None:
    """What ``statement`` binds to ``name`` by a definition or an assignment (not an import)."""
    if isinstance(statement, ast.ClassDef) and statement.name == name:
        return Symbol(CLASS, module, name, statement)
    if isinstance(statement, ast.FunctionDef | ast.AsyncFunctionDef) and statement.name == name:
        return Symbol(FUNCTION, module, name, statement)
    if isinstance(statement, ast.Assign) and any(
        isinstance(target, ast.Name) and target.id == name for target in statement.targets
    ):
        return Symbol(VALUE, module, name, statement.value)
    if (
        isinstance(statement, ast.AnnAssign)
        and isinstance(statement.target, ast.Name)
        and statement.target.id == name
        and statement.value is not None
    ):
        return Symbol(VALUE, module, name, statement.value)
    return None


def _dotted(owner: str, name: str) -> str:
    return f"{owner}.{name}" if owner else name


def _own_member(cls: Symbol, name: str) -> Symbol | None:
    """``name`` in ``cls``'s own body, or assigned as ``self.name`` in one of its methods."""
    assert isinstance(cls.node, ast.ClassDef)
    qualified = f"{cls.name}.{name}"
    for statement in cls.node.body:
        found = _definition(statement, cls.module, name)
        if found is not None:
            node = statement if isinstance(statement, ast.AnnAssign) else found.node
            return Symbol(found.kind, cls.module, qualified, node)
        if (
            isinstance(statement, ast.AnnAssign)
            and isinstance(statement.target, ast.Name)
            and statement.target.id == name
        ):
            return Symbol(VALUE, cls.module, qualified, statement)  # a field without a value
    for statement in cls.node.body:
        if isinstance(statement, ast.FunctionDef | ast.AsyncFunctionDef) and statement.args.args:
            assigned = _assigned_on(statement, statement.args.args[0].arg, name)
            if assigned is not None:
                return Symbol(VALUE, cls.module, qualified, assigned)
    return None


def _assigned_on(
    method: ast.FunctionDef | ast.AsyncFunctionDef, own: str, name: str
) -> ast.AST | None:
    """The first ``own.name = ...`` (or annotated, or augmented) in ``method``."""
    for node in ast.walk(method):
        targets = (
            node.targets
            if isinstance(node, ast.Assign)
            else [node.target]
            if isinstance(node, ast.AnnAssign | ast.AugAssign)
            else []
        )
        for target in targets:
            if (
                isinstance(target, ast.Attribute)
                and target.attr == name
                and isinstance(target.value, ast.Name)
                and target.value.id == own
            ):
                return node
    return None


def is_property(symbol: Symbol) -> bool:
    node = symbol.node
    return isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and bool(
        _decorator_names(node) & {"property", "cached_property"}
    )


def _external_object(symbol: Symbol) -> Any:
    """A standard-library object named by ``symbol`` (imported: the standard library only)."""
    top = symbol.module.split(".")[0]
    if top not in sys.stdlib_module_names and top != "builtins":
        raise LookupError(f"{symbol.where} is outside the wheel and the standard library")
    value: Any = importlib.import_module(symbol.module)
    for part in symbol.name.split(".") if symbol.name else ():
        value = getattr(value, part)
    return value


def _external_has(symbol: Symbol, name: str) -> bool:
    try:
        return hasattr(_external_object(symbol), name)
    except (LookupError, ImportError, AttributeError):
        return False


def _forwards_to_super(node: ast.FunctionDef | ast.AsyncFunctionDef, kwargs: str) -> bool:
    """``node`` calls ``super().__init__(..., **kwargs)``."""
    for call in ast.walk(node):
        if (
            isinstance(call, ast.Call)
            and isinstance(call.func, ast.Attribute)
            and call.func.attr == "__init__"
            and isinstance(call.func.value, ast.Call)
            and isinstance(call.func.value.func, ast.Name)
            and call.func.value.func.id == "super"
            and any(
                k.arg is None and isinstance(k.value, ast.Name) and k.value.id == kwargs
                for k in call.keywords
            )
        ):
            return True
    return False


def function_signature(
    node: ast.FunctionDef | ast.AsyncFunctionDef, *, method: bool
) -> inspect.Signature:
    """The parameters of a function definition (a ``method``'s first left out)."""
    return _signature(node.args, drop_first=method)


def _signature(args: ast.arguments, *, drop_first: bool) -> inspect.Signature:
    """The ``inspect.Signature`` of ``args`` (defaults are not evaluated: :data:`DEFAULT`)."""
    positional = [(a.arg, _KINDS.POSITIONAL_ONLY) for a in args.posonlyargs]
    positional += [(a.arg, _KINDS.POSITIONAL_OR_KEYWORD) for a in args.args]
    first_default = len(positional) - len(args.defaults)
    parameters = [
        _KINDS(name, kind, default=DEFAULT if i >= first_default else _KINDS.empty)
        for i, (name, kind) in enumerate(positional)
    ]
    if drop_first and parameters:
        parameters = parameters[1:]
    if args.vararg is not None:
        parameters.append(_KINDS(args.vararg.arg, _KINDS.VAR_POSITIONAL))
    for argument, default in zip(args.kwonlyargs, args.kw_defaults, strict=True):
        parameters.append(
            _KINDS(
                argument.arg,
                _KINDS.KEYWORD_ONLY,
                default=_KINDS.empty if default is None else DEFAULT,
            )
        )
    if args.kwarg is not None:
        parameters.append(_KINDS(args.kwarg.arg, _KINDS.VAR_KEYWORD))
    return inspect.Signature(parameters)


def binding_problems(
    signature: inspect.Signature, positional: int, keywords: frozenset[str] = frozenset()
) -> list[str]:
    """Why a call with ``positional`` arguments and ``keywords`` (passed by name) would not
    bind to ``signature`` (empty: it binds). A keyword bound only by ``**kwargs`` is a problem:
    it may be forwarded to something that lacks it."""
    wanted = set(keywords)
    parameters = list(signature.parameters.values())
    takes_positional = [
        p for p in parameters if p.kind in (_KINDS.POSITIONAL_ONLY, _KINDS.POSITIONAL_OR_KEYWORD)
    ]
    problems: list[str] = []
    star = any(p.kind == _KINDS.VAR_POSITIONAL for p in parameters)
    if positional > len(takes_positional) and not star:
        problems.append(
            f"takes {len(takes_positional)} positional argument(s), we pass {positional}"
        )
    filled = {p.name for p in takes_positional[:positional]}
    named = {
        p.name for p in parameters if p.kind in (_KINDS.POSITIONAL_OR_KEYWORD, _KINDS.KEYWORD_ONLY)
    }
    problems += [
        f"has no parameter {k!r} (a keyword we pass)" for k in sorted(wanted) if k not in named
    ]
    problems += [
        f"parameter {k!r} is given positionally and by keyword" for k in sorted(wanted & filled)
    ]
    required = [
        p.name
        for p in parameters
        if p.default is _KINDS.empty
        and p.kind not in (_KINDS.VAR_POSITIONAL, _KINDS.VAR_KEYWORD)
        and p.name not in filled
        and p.name not in wanted
    ]
    problems += [f"requires {name!r}, which we do not pass" for name in required]
    return problems

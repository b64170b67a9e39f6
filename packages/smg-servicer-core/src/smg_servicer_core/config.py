"""Settings resolved from flag > environment > default, each remembering where it came from.

A package declares its settings once as :class:`Setting` values; :func:`resolve` reads the parsed
flags and an environment mapping (never ``os.environ`` implicitly, never at import time), parses
and validates every value, and returns a :class:`ResolvedSettings` whose entries carry their
``source`` (``flag``, ``env`` or ``default``). An environment value used for a setting whose
variable is deprecated logs one deprecation line. Any bad value raises :class:`ConfigError`, which
the entry point turns into one line on stderr and exit code 2.

Flags must be declared with ``default=None`` (``add_to_parser`` does this) so that "not given"
can be told apart from "given the default".
"""

from __future__ import annotations

import argparse
import logging
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Literal, TypeVar

from smg_servicer_core.errors import ConfigError

logger = logging.getLogger(__name__)

T = TypeVar("T")
Source = Literal["flag", "env", "default"]


@dataclass(frozen=True)
class Setting(Generic[T]):
    """One setting: its flag, its environment variable, its default and its checks."""

    name: str
    parse: Callable[[str], T]
    default: T
    help: str
    flag: str | None = None
    env: str | None = None
    #: The environment variable still works but is on its way out: using it logs a line.
    env_deprecated: bool = False
    validate: Callable[[T], str | None] | None = None
    #: A password or token: :meth:`ResolvedSettings.describe` shows it as ``***``.
    secret: bool = False

    def add_to_parser(self, parser: argparse.ArgumentParser | Any) -> None:
        if self.flag is None:
            return
        env_note = f" [env {self.env}]" if self.env else ""
        parser.add_argument(
            self.flag,
            dest=self.name,
            default=None,
            **self._flag_kind(),
            help=f"{self.help} (default: {self._default_shown()}){env_note}",
        )

    def _flag_kind(self) -> dict[str, Any]:
        return {"type": str}

    def _default_shown(self) -> str:
        return repr(self.default)


@dataclass(frozen=True)
class Switch(Setting[bool]):
    """A boolean setting whose flag takes no value (given: on); its variable takes 1/0,
    true/false, yes/no or on/off (:func:`parse_bool`)."""

    def _flag_kind(self) -> dict[str, Any]:
        return {"action": "store_const", "const": "true"}

    def _default_shown(self) -> str:
        return "on" if self.default else "off"


@dataclass(frozen=True)
class Resolved(Generic[T]):
    value: T
    source: Source
    secret: bool = False

    def shown(self) -> str:
        return "***" if self.secret and self.value else repr(self.value)


@dataclass(frozen=True)
class ResolvedSettings:
    values: Mapping[str, Resolved[Any]] = field(default_factory=dict[str, Resolved[Any]])

    def __getitem__(self, name: str) -> Any:
        return self.values[name].value

    def get(self, name: str, default: Any = None) -> Any:
        """The setting's value, or ``default`` when this set has no such setting."""
        found = self.values.get(name)
        return default if found is None else found.value

    def source(self, name: str) -> Source:
        return self.values[name].source

    def __iter__(self) -> Iterator[str]:
        return iter(self.values)

    def describe(self) -> str:
        """One loggable line: ``name=value (source)`` for every setting, secrets as ``***``."""
        return ", ".join(f"{n}={r.shown()} ({r.source})" for n, r in self.values.items())


def _parse_one(setting: Setting[Any], raw: str, where: str) -> Any:
    try:
        value = setting.parse(raw)
    except (TypeError, ValueError) as exc:
        shown = "***" if setting.secret else repr(raw)
        raise ConfigError(f"{where}: invalid value {shown}: {exc}") from exc
    return value


def resolve(
    settings: Sequence[Setting[Any]],
    namespace: argparse.Namespace | None,
    environ: Mapping[str, str],
) -> ResolvedSettings:
    values: dict[str, Resolved[Any]] = {}
    for setting in settings:
        flag_raw = getattr(namespace, setting.name, None) if namespace is not None else None
        env_raw = environ.get(setting.env) if setting.env else None
        if flag_raw is not None:
            where = setting.flag or setting.name
            value, source = _parse_one(setting, str(flag_raw), where), "flag"
        elif env_raw is not None and env_raw.strip() != "":
            where = setting.env or setting.name
            value, source = _parse_one(setting, env_raw.strip(), where), "env"
            if setting.env_deprecated:
                flag_hint = f"; use {setting.flag}" if setting.flag else ""
                logger.warning(
                    "%s is deprecated and goes away in the next minor release%s",
                    setting.env,
                    flag_hint,
                )
        else:
            where, value, source = (
                setting.flag or setting.env or setting.name,
                setting.default,
                "default",
            )
        if setting.validate is not None:
            problem = setting.validate(value)
            if problem:
                shown = "***" if setting.secret else repr(value)
                raise ConfigError(f"{where}: {problem} (got {shown})")
        values[setting.name] = Resolved(value=value, source=source, secret=setting.secret)
    return ResolvedSettings(values)


def environment() -> Mapping[str, str]:
    """The process environment. The only reader of ``os.environ`` in ``src/`` (ruff's banned-API
    table refuses it elsewhere), so every variable is read through a :class:`Setting`."""
    return os.environ  # noqa: TID251 - the one sanctioned read


def setting_value(setting: Setting[T], environ: Mapping[str, str] | None = None) -> T:
    """One setting from the environment (no flag), validated; for code paths with no parser,
    such as servicers constructed by an engine's own launcher."""
    return resolve((setting,), None, environment() if environ is None else environ)[setting.name]


# Parsers and validators shared by packages.


def parse_bool(raw: str) -> bool:
    lowered = raw.strip().lower()
    if lowered in {"1", "true", "yes", "on"}:
        return True
    if lowered in {"0", "false", "no", "off"}:
        return False
    raise ValueError("expected one of 1/0, true/false, yes/no, on/off")


def at_least(minimum: float) -> Callable[[float], str | None]:
    def check(value: float) -> str | None:
        return None if value >= minimum else f"must be >= {minimum}"

    return check


def port_number(value: int) -> str | None:
    return None if 0 <= value <= 65535 else "must be a TCP port between 0 and 65535"

"""Import-only ``viztracer``: TokenSpeed imports it for optional tracing, which these tests never
turn on (a class name gives an empty class, anything else a no-op). When it goes away: install the
real ``viztracer`` if tracing is wanted."""

from __future__ import annotations

from typing import Any


def __getattr__(name: str) -> Any:
    if name.startswith("__"):
        raise AttributeError(name)
    if name[:1].isupper():
        return type(name, (), {"__module__": __name__})
    return lambda *args, **kwargs: None

"""The CPU platform of the ``tokenspeed_kernel`` stand-in: no accelerator of any kind."""

from __future__ import annotations

from typing import Any


class CpuPlatform:
    device_type = "cpu"
    name = "cpu"

    def __getattr__(self, item: str) -> Any:
        # is_nvidia, is_amd, is_npu, has_*, supports_*: all False on this machine.
        if item.startswith(("is_", "has_", "supports")):
            return False
        raise AttributeError(f"CPU platform stub has no {item!r}")


_PLATFORM = CpuPlatform()


def current_platform() -> CpuPlatform:
    return _PLATFORM


def pdl_enabled(*args: Any, **kwargs: Any) -> bool:
    return False

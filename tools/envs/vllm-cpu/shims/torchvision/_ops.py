"""The ops themselves: resize, normalize, crop, center_crop, pad, pil_to_tensor,
grayscale_to_rgb and the interpolation modes (what transformers' torchvision backend calls)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from enum import Enum
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F


class InterpolationMode(Enum):
    NEAREST = "nearest"
    NEAREST_EXACT = "nearest-exact"
    BILINEAR = "bilinear"
    BICUBIC = "bicubic"
    BOX = "box"
    HAMMING = "hamming"
    LANCZOS = "lanczos"


def _edges(height: int, width: int, size: int | Sequence[int]) -> list[int]:
    sizes = [size] if isinstance(size, int) else list(size)
    if len(sizes) == 2:
        return sizes
    short = sizes[0]
    if height <= width:
        return [short, int(short * width / height)]
    return [int(short * height / width), short]


def resize(
    inpt: torch.Tensor,
    size: int | Sequence[int],
    interpolation: Any = InterpolationMode.BILINEAR,
    max_size: int | None = None,
    antialias: bool = True,
) -> torch.Tensor:
    mode = InterpolationMode(interpolation).value
    if mode not in ("nearest", "nearest-exact", "bilinear", "bicubic"):
        raise NotImplementedError(f"torchvision shim: resize mode {mode}")
    shape = inpt.shape
    edges = _edges(shape[-2], shape[-1], size)
    x = inpt.reshape(-1, *shape[-3:])
    smooth = mode in ("bilinear", "bicubic")
    options: dict[str, Any] = {"antialias": antialias, "align_corners": False} if smooth else {}
    y = F.interpolate(x.float(), size=edges, mode=mode, **options)
    if inpt.dtype == torch.uint8:
        y = y.round_().clamp_(0, 255).to(torch.uint8)
    return y.reshape(*shape[:-2], *edges)


def normalize(
    inpt: torch.Tensor, mean: Sequence[float], std: Sequence[float], inplace: bool = False
) -> torch.Tensor:
    m = torch.as_tensor(mean, dtype=inpt.dtype).view(-1, 1, 1)
    s = torch.as_tensor(std, dtype=inpt.dtype).view(-1, 1, 1)
    return inpt.sub_(m).div_(s) if inplace else (inpt - m) / s


def crop(inpt: torch.Tensor, top: int, left: int, height: int, width: int) -> torch.Tensor:
    return inpt[..., top : top + height, left : left + width]


def center_crop(inpt: torch.Tensor, output_size: int | Sequence[int]) -> torch.Tensor:
    height, width = [output_size] * 2 if isinstance(output_size, int) else list(output_size)
    top = round((inpt.shape[-2] - height) / 2.0)
    left = round((inpt.shape[-1] - width) / 2.0)
    return crop(inpt, top, left, height, width)


def pad(
    inpt: torch.Tensor,
    padding: int | Sequence[int],
    fill: float = 0,
    padding_mode: str = "constant",
) -> torch.Tensor:
    if padding_mode != "constant":
        raise NotImplementedError(f"torchvision shim: pad mode {padding_mode}")
    sides = [padding] * 4 if isinstance(padding, int) else list(padding)
    if len(sides) == 2:
        sides = [sides[0], sides[1], sides[0], sides[1]]
    left, top, right, bottom = sides
    return F.pad(inpt, (left, right, top, bottom), value=fill or 0)


def pil_to_tensor(pic: Any) -> torch.Tensor:
    array = np.array(pic, copy=True)
    if array.ndim == 2:
        array = array[:, :, None]
    return torch.from_numpy(array).permute(2, 0, 1).contiguous()


def grayscale_to_rgb(inpt: torch.Tensor) -> torch.Tensor:
    if inpt.shape[-3] == 3:
        return inpt
    return inpt.expand(*inpt.shape[:-3], 3, *inpt.shape[-2:])


def missing(module: str) -> Callable[[str], Any]:
    """A module ``__getattr__``: any other name is a function that raises when called."""

    def __getattr__(name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)

        def absent(*_args: object, **_kwargs: object) -> Any:
            raise NotImplementedError(f"{module}.{name}: not in the torchvision test shim")

        return absent

    return __getattr__


__all__ = [
    "InterpolationMode",
    "center_crop",
    "crop",
    "grayscale_to_rgb",
    "normalize",
    "pad",
    "pil_to_tensor",
    "resize",
]

"""See :mod:`torchvision._ops`."""

from torchvision._ops import InterpolationMode, missing

from . import functional, v2

__all__ = ["InterpolationMode", "functional", "v2"]
__getattr__ = missing(__name__)

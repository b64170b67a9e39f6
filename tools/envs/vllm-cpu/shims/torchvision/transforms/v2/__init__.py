"""See :mod:`torchvision._ops`."""

from torchvision._ops import InterpolationMode, missing

from . import functional

__all__ = ["InterpolationMode", "functional"]
__getattr__ = missing(__name__)

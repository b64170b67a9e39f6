"""See :mod:`torchvision._ops`."""

from torchvision._ops import *  # noqa: F403
from torchvision._ops import missing

__getattr__ = missing(__name__)

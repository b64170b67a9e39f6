"""Names transformers imports; decoding is vLLM's (OpenCV), so these raise when called."""

from enum import Enum

from torchvision._ops import missing


class ImageReadMode(Enum):
    UNCHANGED = 0
    GRAY = 1
    RGB = 3


__getattr__ = missing(__name__)

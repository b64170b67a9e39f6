"""Test shim: a functional stand-in for the few ``torchvision`` ops transformers' video processors
call, on ``torch.nn.functional`` (issue #45).

Why: every video-capable vLLM model here goes through a transformers 5.19 video processor, and
those need torchvision (there is no PIL video path). PyPI's torchvision links CUDA and breaks
``import vllm`` next to torch+cpu, and the PyTorch CPU index cannot be reached from here.

Scope: only the processes of the video tests, through ``PYTHONPATH``
(``smg_it.video.SHIM_PATH``); never installed into an environment. Version 0.26 on purpose:
below 0.27, transformers keeps LANCZOS image processors (the tiny Idefics3's) on their PIL
backend, and from 0.26 it leaves video decoding to the caller (vLLM decodes with OpenCV).
Anything not defined here raises when called.
"""

from torchvision import io, transforms

__version__ = "0.26.0+smgshim"
__all__ = ["io", "transforms"]

"""``tokenspeed_triton`` (TokenSpeed's triton fork) is this environment's triton.

Why: TokenSpeed's kernels decorate functions with ``tokenspeed_triton.jit`` at import; the fork
ships only with the CUDA stack. Nothing is compiled or launched on the front-end path, so the
upstream triton's decorators suffice. When it goes away: on a GPU machine (the real fork).
"""

from __future__ import annotations

import sys

import triton
import triton.language

sys.modules[__name__] = triton
sys.modules[f"{__name__}.language"] = triton.language

"""Test-environment shim: a stand-in ``torchvision`` that only satisfies module-level imports.

Why: SGLang 0.5.23 imports torchvision at module level (``sglang.srt.configs`` →
``nano_nemotron_vl`` → ``multimodal/internvl_utils``) even for text-only models. PyPI's torchvision
cannot load next to torch+cpu, and installing it replaces torch with the CUDA build (+3.5 GB).
This finder serves ``torchvision`` and its submodules as empty modules whose attributes are inert
placeholders. Calling anything from it raises. transformers 5.19 finds the module (its check is
``find_spec``) and reports torchvision available, so where nothing asks for PIL it picks an image
processor's torchvision backend, whose calls raise here: the image tests ask SGLang for the PIL
backend (``image_processor_backend="pil"``, ``smg_it.sglang_reference``) and transformers for it
(``backend="pil"``, ``test_images.py``).

When it stops being needed: once SGLang imports torchvision lazily, or a CPU build of torchvision
matching the test torch resolves from the indexes we use. Installed by ``install.sh`` through a
``.pth`` file in the SGLang test environment only.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types


class _Placeholder:
    def __init__(self, name: str) -> None:
        self._name = name

    def __call__(self, *_args: object, **_kwargs: object) -> object:
        raise NotImplementedError(f"{self._name}: torchvision is not installed (test shim)")

    def __getattr__(self, attr: str) -> _Placeholder:
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _Placeholder(f"{self._name}.{attr}")

    def __mro_entries__(self, _bases: tuple[object, ...]) -> tuple[type, ...]:
        return (object,)

    # In annotations evaluated at class definition (``PILImageResampling | InterpolationMode``,
    # transformers' video processors, which the Qwen-VL processor's AutoProcessor imports).
    def __or__(self, _other: object) -> _Placeholder:
        return self

    def __ror__(self, _other: object) -> _Placeholder:
        return self


class _ShimModule(types.ModuleType):
    def __getattr__(self, attr: str) -> _Placeholder:
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _Placeholder(f"{self.__name__}.{attr}")


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(
        self, fullname: str, path: object = None, target: object = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != "torchvision" and not fullname.startswith("torchvision."):
            return None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = _ShimModule(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        if module.__name__ == "torchvision":
            module.__version__ = "0.0.0+shim"  # type: ignore[attr-defined]


def install() -> None:
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.append(_Finder())

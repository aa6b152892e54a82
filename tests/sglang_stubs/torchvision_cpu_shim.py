"""Keeps PyPI's torchvision from importing its operator registrations when its compiled ops cannot load.

Why: sglang 0.5.23 imports torchvision on its CPU engine path (sglang.srt.multimodal.internvl_utils and, via
transformers, image_utils). PyPI's Linux torchvision 0.28 wheel is a CUDA build: its `_C.so` links
libtorch_cuda, so next to the CPU torch 2.13.0 of .venv-sglang it fails to load (torchvision handles
that), but `torchvision/_meta_registrations.py` then calls `torch.library.register_fake("torchvision::nms")`
unguarded and the import dies with "operator torchvision::nms does not exist". Those registrations only
describe fake (meta) kernels of detection ops that do not exist here, and nothing on the text-model path
uses them, so this finder hands torchvision an empty module for `torchvision._meta_registrations`.

Installed by scripts/setup_sglang_env.sh through a .pth file (`import torchvision_cpu_shim`); only
.venv-sglang sees it. Importing this module does not import torch or torchvision.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types
from collections.abc import Sequence
from typing import Any

SHIMMED = "torchvision._meta_registrations"


class _EmptyRegistrations(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname: str, path: Sequence[str] | None, target: types.ModuleType | None = None) -> Any:
        if fullname == SHIMMED:
            return importlib.machinery.ModuleSpec(fullname, self)
        return None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        return types.ModuleType(spec.name, "Empty stand-in (tests/sglang_stubs/torchvision_cpu_shim.py).")

    def exec_module(self, module: types.ModuleType) -> None:
        return None


def install() -> None:
    if not any(isinstance(f, _EmptyRegistrations) for f in sys.meta_path):
        sys.meta_path.insert(0, _EmptyRegistrations())


install()

"""Lets torchvision's Python files import on a CPU torch in the cached vLLM venv (tools/vllm_venv.sh).

Why: PyPI's torchvision 0.28 wheel is a CUDA build whose compiled ops do not load against the CPU torch,
and its import then registers fake kernels for ``torchvision::nms`` and ``::qnms``, which fail when those
ops were never defined. transformers imports torchvision whenever it is installed, and Qwen3.5's vLLM model
needs it. vllm_venv.sh installs this file with a .pth line; the hook runs once, on the first import of
torchvision, defines the two schemas (no kernels: nothing here calls them) and removes itself.
"""

from __future__ import annotations

import sys
from typing import Any

_LIBRARIES: list[Any] = []  # a torch Library drops its definitions when collected


class DefineTorchvisionOpsFirst:
    @staticmethod
    def find_spec(name: str, path: Any = None, target: Any = None) -> None:
        if name == "torchvision":
            sys.meta_path.remove(DefineTorchvisionOpsFirst)
            import torch

            library = torch.library.Library("torchvision", "FRAGMENT")
            for op in ("nms", "qnms"):
                library.define(f"{op}(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
            _LIBRARIES.append(library)
        return None  # the regular finders import torchvision itself


sys.meta_path.insert(0, DefineTorchvisionOpsFirst)

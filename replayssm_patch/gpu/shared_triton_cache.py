"""One Triton kernel cache for every engine a GPU session starts, so only the first compiles the kernels.

Why: vLLM 0.24 points ``TRITON_CACHE_DIR`` at a folder inside its compile cache keyed by the engine's config hash
(``compiler_interface.InductorAdaptor.initialize_cache``), and a plugin knob or a speculative config changes that
hash. So every arm of a comparison compiled (and autotuned) vLLM's SSD / FLA prefill kernels anew: every
default-mode start-up on the H200 spent 76-91 s in vLLM's "Initial profiling/warmup run", the second engine on a
host as long as the first. Triton builds its file cache through the class ``TRITON_CACHE_MANAGER`` names; this one
keeps Triton's own cache but roots it at ``SHARED_DIR_VAR`` when that is set (tools/gpu/session.sh sets both):

    TRITON_CACHE_MANAGER=replayssm_patch.gpu.shared_triton_cache:SharedTritonCache REPLAYBENCH_TRITON_CACHE=DIR

A kernel's entry is keyed by its source, options and target, so engines of different configs share only what is
the same kernel. For the GPU tooling only: the plugin never sets it, and a step's speed does not depend on it
(start-up times do: a later engine on the host starts faster).
"""

from __future__ import annotations

import os

from triton.runtime.cache import FileCacheManager

SHARED_DIR_VAR = "REPLAYBENCH_TRITON_CACHE"


class SharedTritonCache(FileCacheManager):
    def __init__(self, key: str, override: bool = False, dump: bool = False) -> None:
        super().__init__(key, override, dump)
        shared = os.environ.get(SHARED_DIR_VAR)
        if shared and not (override or dump):  # the override and dump folders stay Triton's
            self.cache_dir = os.path.join(shared, key)
            self.lock_path = os.path.join(self.cache_dir, "lock")
            os.makedirs(self.cache_dir, exist_ok=True)

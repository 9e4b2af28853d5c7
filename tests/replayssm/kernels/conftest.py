"""Run the ReplaySSM Triton kernels on CPU through Triton's interpreter.

triton.jit picks interpreter or compiler when a kernel module is imported, so TRITON_INTERPRET must be set
before that; if another test already imported the kernel modules compiled-mode, drop them so the tests here
import them afresh in interpreter mode.
"""

import os
import sys

os.environ["TRITON_INTERPRET"] = "1"
for _name in [name for name in sys.modules if name.startswith("replayssm_patch.kernels")]:
    del sys.modules[_name]

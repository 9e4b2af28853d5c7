"""Run the ReplaySSM Triton kernels on CPU through Triton's interpreter, without leaking that to other tests.

triton.jit picks interpreter or compiler when a kernel module is imported, so TRITON_INTERPRET must be set
then: the kernel modules are (re)imported here with it set, and the variable is restored right after so the
rest of the suite (and the processes it starts) never sees it. During these tests a fixture sets it again,
since the interpreter and our launch check read it at call time too.
"""

import os
import sys

import pytest

if "triton.language" in sys.modules and os.environ.get("TRITON_INTERPRET") != "1":
    # triton's own library functions (tl.sum, ...) are decorated when triton is first imported; imported compiled,
    # interpreted kernels cannot call them. Some module collected earlier imported triton: keep it Triton-free.
    raise RuntimeError(
        "triton was imported before the kernel tests set TRITON_INTERPRET=1 (a test module collected earlier "
        "imports replayssm_patch.kernels); import it lazily there"
    )
_saved = os.environ.get("TRITON_INTERPRET")
os.environ["TRITON_INTERPRET"] = "1"
for _name in [name for name in sys.modules if name.startswith("replayssm_patch.kernels")]:
    del sys.modules[_name]  # imported earlier in compiled mode: import again, interpreted
import replayssm_patch.kernels  # noqa: E402, F401  (decorates every kernel as an interpreted function)

if _saved is None:
    del os.environ["TRITON_INTERPRET"]
else:
    os.environ["TRITON_INTERPRET"] = _saved


@pytest.fixture(autouse=True)
def triton_interpreter(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRITON_INTERPRET", "1")

"""expose_plugin: a Python that does not have this project installed finds the plugin's entry point, and so do
the processes it starts (vLLM's engine core and workers)."""

import shutil
import subprocess
import sys
from pathlib import Path

from replayssm_patch.plugin_site import REPO

# `python -S` skips site-packages, where the dev install's own dist-info would already declare the entry point;
# the probe runs in a copy of the package and pyproject, away from the checkout's editable-install egg-info.
PROBE = """
import importlib.metadata as m, subprocess, sys
sys.path.insert(0, ".")
def names():
    return sorted(e.name for e in m.entry_points(group="vllm.general_plugins"))
before = names()
from replayssm_patch.plugin_site import expose_plugin
expose_plugin()
child = subprocess.run([sys.executable, "-S", "-c", "import importlib.metadata as m; "
                        "print(sorted(e.value for e in m.entry_points(group='vllm.general_plugins')))"],
                       capture_output=True, text=True, check=True).stdout.strip()
print(before, names(), child)
"""


def test_expose_plugin_makes_the_entry_point_visible_here_and_in_children(tmp_path: Path) -> None:
    shutil.copytree(REPO / "replayssm_patch", tmp_path / "replayssm_patch", ignore=shutil.ignore_patterns("results"))
    shutil.copy(REPO / "pyproject.toml", tmp_path)
    run = subprocess.run([sys.executable, "-S", "-c", PROBE], capture_output=True, text=True, check=True, cwd=tmp_path)
    out = run.stdout
    assert out.strip() == "[] ['replayssm'] ['replayssm_patch:register']"

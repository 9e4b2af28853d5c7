"""Make the plugin visible to a vLLM that is not installed with this project (CPU test venv, GPU bundle).

vLLM finds general plugins through ``importlib.metadata`` entry points, so a folder holding a
``*.dist-info`` with the entry points pyproject.toml declares, put on PYTHONPATH together with the
checkout, is enough; no wheel build or install into someone else's environment.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import os
import sys
import tempfile
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
GROUP = "vllm.general_plugins"


def _project(pyproject: Path) -> dict:
    return tomllib.loads(pyproject.read_text())["project"]


def write_plugin_site(root: Path, pyproject: Path = REPO / "pyproject.toml") -> Path:
    """Create ``root`` with a dist-info declaring pyproject's vllm.general_plugins; returns ``root``."""
    project = _project(pyproject)
    plugins = project["entry-points"][GROUP]
    info = root / f"{project['name']}-{project['version']}.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {project['name']}\nVersion: {project['version']}\n")
    lines = "".join(f"{name} = {target}\n" for name, target in plugins.items())
    (info / "entry_points.txt").write_text(f"[{GROUP}]\n{lines}")
    return root


def plugin_pythonpath(root: Path) -> str:
    """PYTHONPATH entries (site folder, checkout) that let vLLM load this checkout's plugin."""
    return f"{write_plugin_site(root)}:{REPO}"


def expose_plugin(root: Path | None = None) -> None:
    """Make this checkout's plugin loadable by a vLLM started from this process (`vllm.LLM`) and its children.

    Nothing happens when the entry points are already visible (tools/gpu/session.sh puts /tmp/rb-site on
    PYTHONPATH); otherwise a site folder is written (default: a fresh temporary one) and put first on
    ``sys.path`` and ``PYTHONPATH``.
    """
    visible = {e.name for e in importlib.metadata.entry_points(group=GROUP)}
    if set(_project(REPO / "pyproject.toml")["entry-points"][GROUP]) <= visible:
        return
    entries = plugin_pythonpath(root or Path(tempfile.mkdtemp(prefix="replayssm-site-"))).split(":")
    sys.path[:0] = entries
    os.environ["PYTHONPATH"] = os.pathsep.join([*entries, *filter(None, [os.environ.get("PYTHONPATH")])])
    importlib.invalidate_caches()

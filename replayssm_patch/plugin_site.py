"""Make the plugin visible to a vLLM that is not installed with this project (CPU test venv, GPU bundle).

vLLM finds general plugins through ``importlib.metadata`` entry points, so a folder holding a
``*.dist-info`` with the entry points pyproject.toml declares, put on PYTHONPATH together with the
checkout, is enough; no wheel build or install into someone else's environment.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
GROUP = "vllm.general_plugins"


def write_plugin_site(root: Path, pyproject: Path = REPO / "pyproject.toml") -> Path:
    """Create ``root`` with a dist-info declaring pyproject's vllm.general_plugins; returns ``root``."""
    project = tomllib.loads(pyproject.read_text())["project"]
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

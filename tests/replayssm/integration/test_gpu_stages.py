"""The GPU host's shell stages (tools/gpu) as far as a CPU machine can check them: syntax, the MODEL switch's refusal
before anything is touched, and the qwen3.5-4b A/B config against the server flags session.sh starts it with."""

from __future__ import annotations

import os
import subprocess
import tomllib
from pathlib import Path

import pytest

from replayssm_patch.gpu.variants import family_flags

REPO = Path(__file__).resolve().parents[3]
STAGES = sorted((REPO / "tools" / "gpu").glob("*.sh"))


@pytest.mark.parametrize("script", STAGES, ids=lambda p: p.name)
def test_stage_scripts_parse(script: Path) -> None:
    done = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize(("script", "stage"), [("onegpu.sh", "ab"), ("session.sh", "setup")])
def test_unknown_model_is_refused_in_one_line(script: str, stage: str) -> None:
    env = os.environ | {"MODEL": "llama"}
    done = subprocess.run(["bash", f"tools/gpu/{script}", stage], capture_output=True, text=True, cwd=REPO, env=env)
    assert done.returncode == 2 and done.stdout.count("\n") == 1
    assert done.stdout.startswith("MODEL=llama: ") and "MODEL=qwen35" in done.stdout


def test_qwen_ab_config_serves_as_session_sh_does(tmp_path: Path) -> None:
    """Both arms: the Nemotron A/B's server flags on /tmp/model-qwen35 plus the family's; only the knob differs."""
    (tmp_path / "config.json").write_text((REPO / "configs/models/qwen3.5-4b.json").read_text())
    qwen = tomllib.loads((REPO / "configs/h200-1gpu-qwen3.5-4b.toml").read_text())
    nemotron = tomllib.loads((REPO / "configs/h200-1gpu-nemotron-h-8b.toml").read_text())
    for arm in ("baseline", "candidate"):
        command, reference = qwen["arms"][arm]["command"], nemotron["arms"][arm]["command"]
        port = command.index("--port")
        assert command[port - len(family_flags(tmp_path)) : port] == family_flags(tmp_path)
        without_family = command[: port - len(family_flags(tmp_path))] + command[port:]
        assert without_family == [("/tmp/model-qwen35" if a == "/tmp/model" else a) for a in reference]
        assert qwen["arms"][arm]["supports"] == ["Qwen3_5ForConditionalGeneration"]
    assert qwen["trace"] == nemotron["trace"] and qwen["slo"] == nemotron["slo"]

"""The GPU host's shell stages (tools/gpu) as far as a CPU machine can check them: syntax, the MODEL switch's refusal
before anything is touched, and the qwen3.5-4b and MTP A/B configs against the server flags session.sh starts them
with."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from replayssm_patch.gpu.engine_pair import WHAT as PAIR_WHAT
from replayssm_patch.gpu.engine_pair import pair_row
from replayssm_patch.gpu.row_file import record_row
from replayssm_patch.gpu.variants import family_flags, speculative_config

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


CARDS = [("NVIDIA H100 80GB HBM3", "h100"), ("NVIDIA H200", "h200"), (None, "h200")]


@pytest.mark.parametrize(("smi_name", "card"), CARDS)
def test_results_files_are_named_for_the_card(tmp_path: Path, smi_name: str | None, card: str) -> None:
    """Session 31 ran on an H100 while every results file said h200: the stages now name them for the card that
    nvidia-smi reports (h200 where it reports none), and the launch table the queue starts from is that card's."""
    smi = tmp_path / "nvidia-smi"  # this card's, or one that finds no GPU
    smi.write_text(f"#!/bin/sh\necho '{smi_name}'\n" if smi_name else "#!/bin/sh\nexit 9\n")
    smi.chmod(0o755)
    state = tmp_path / "gpu"
    env = os.environ | {"PATH": f"{tmp_path}:{Path(sys.executable).parent}:/usr/bin:/bin", "GPU_STATE": str(state)}
    done = subprocess.run(["bash", "tools/gpu/session.sh", "card"], capture_output=True, text=True, cwd=REPO, env=env)
    assert done.returncode == 0 and done.stdout == f"{card}\n", done.stderr
    assert (REPO / f"replayssm_patch/kernels/launch_{card}.json").exists()
    # the card's committed rows and their history seed the host's results, so a rerun pools with earlier runs
    committed = REPO / "replayssm_patch/gpu/results"
    for name in (f"engine_step-{card}.json", f"engine_step-{card}.history.jsonl"):
        seeded = state / "out" / name
        assert seeded.exists() == (committed / name).exists()
        assert not seeded.exists() or seeded.read_bytes() == (committed / name).read_bytes()


def test_the_spec_stage_on_the_mtp_floor_runs_the_floor_model_not_the_real_one(tmp_path: Path) -> None:
    """MODEL=mtpfloor (replayssm.sh specfloor:ARM) points spec_step at the MTP model's floor, and says which model
    is missing before an engine starts (the real model's rows must not be replaced by the floor's)."""
    if Path("/tmp/model-mtp-floor/config.json").exists():
        pytest.skip("this machine has a floor model at /tmp/model-mtp-floor")
    env = os.environ | {"MODEL": "mtpfloor", "MODE": "default"}
    done = subprocess.run(["bash", "tools/gpu/session.sh", "spec", "replayssm_spec", "0", "128"], capture_output=True,
                          text=True, cwd=REPO, env=env)  # fmt: skip
    assert done.returncode == 1
    assert done.stdout.strip().startswith("no /tmp/model-mtp-floor: ")


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


def test_mtp_ab_config_speculates_alike_in_both_arms_as_session_sh_serves() -> None:
    """MODEL=mtp: the Nemotron A/B's server flags on /tmp/model-mtp with the spec arms' --speculative-config before
    --port (where session.sh serve puts it), so only the plugin knob differs; the harness reads AL 3.0 in both;
    the traffic is the first part of the Nemotron A/B's window."""
    from harness.analysis.spec_config import configured_speculation
    from harness.experiment.config import load_config

    path = REPO / "configs/h200-1gpu-nemotron-h-8b-mtp.toml"
    mtp = tomllib.loads(path.read_text())
    nemotron = tomllib.loads((REPO / "configs/h200-1gpu-nemotron-h-8b.toml").read_text())
    flag = ["--speculative-config", json.dumps(speculative_config(), separators=(",", ":"))]
    for arm in ("baseline", "candidate"):
        command, reference = mtp["arms"][arm]["command"], nemotron["arms"][arm]["command"]
        port = reference.index("--port")
        expected = [("/tmp/model-mtp" if a == "/tmp/model" else a) for a in reference]
        assert command == expected[:port] + flag + expected[port:]
        speculation = configured_speculation(command)
        assert speculation is not None and speculation.tokens == 3 and speculation.acceptance_length == 3.0
    # the same traffic and SLO as the standard A/B; the window may be cut shorter (its first 100 s) to fit a session
    window = mtp["trace"].pop("duration_s"), nemotron["trace"].pop("duration_s")
    assert mtp["trace"] == nemotron["trace"] and mtp["slo"] == nemotron["slo"] and 60 <= window[0] <= window[1]
    assert load_config(path).name == "h200-1gpu-nemotron-h-8b-mtp"


def test_variants_prints_the_spec_arms_speculation_for_session_sh() -> None:
    """session.sh's serve adds `variants --speculative` under MODEL=mtp: the config's flag, above."""
    done = subprocess.run([sys.executable, "-m", "replayssm_patch.gpu.variants", "--speculative"], capture_output=True,
                          text=True, cwd=REPO, check=True)  # fmt: skip
    assert json.loads(done.stdout) == speculative_config() == {
        "method": "mtp", "num_speculative_tokens": 3, "rejection_sample_method": "synthetic",
        "synthetic_acceptance_length": 3.0,
    }  # fmt: skip


def test_setup_without_the_carried_wheels_is_refused_in_one_line(tmp_path: Path) -> None:
    """A host without .whl/ (tomli_w, typer) installs vLLM fine but every `replaybench run` dies there later: setup
    refuses at once, before unpacking anything (a checkout without .whl/, as a clean clone is)."""
    (tmp_path / "tools" / "gpu").mkdir(parents=True)
    script = tmp_path / "tools" / "gpu" / "session.sh"
    script.write_text((REPO / "tools" / "gpu" / "session.sh").read_text())
    env = os.environ | {"MODE": "default"}
    done = subprocess.run(["bash", str(script), "setup"], capture_output=True, text=True, cwd=tmp_path, env=env)
    assert done.returncode == 1
    assert done.stdout.strip() == "setup: no .whl/ here: carry .whl with part 3 (README)"


def test_each_transfer_copies_its_part_and_whichever_installer_files_rode_with_it(tmp_path: Path) -> None:
    """The repo, part 0 and the zstandard wheel together passed the device's 64 MiB (session 23): the installer's
    files may ride with any part, and the call that gets them copies them beside the parts."""
    (tmp_path / "tools" / "gpu").mkdir(parents=True)
    (tmp_path / "tools" / "gpu" / "session.sh").write_text((REPO / "tools" / "gpu" / "session.sh").read_text())
    carried = tmp_path / ".gpu"
    carried.mkdir()
    pkg = tmp_path / "pkg"

    def recv(part: int | None, *files: str) -> set[str]:
        for old in carried.iterdir():
            old.unlink()  # a call carries only its own files
        for name in ([] if part is None else [f"site.part0{part}"]) + list(files):
            (carried / name).write_text(name)
        args = [] if part is None else [str(part)]
        done = subprocess.run(["bash", "tools/gpu/session.sh", "recv", *args], capture_output=True, text=True,
                              cwd=tmp_path, env=os.environ | {"PKG": str(pkg)})  # fmt: skip
        assert done.returncode == 0, done.stdout + done.stderr
        return {p.name for p in pkg.iterdir()}

    assert recv(0, "SHA256", "install-bundle.sh") == {"site.part00", "SHA256", "install-bundle.sh"}
    assert recv(1) == {"site.part00", "site.part01", "SHA256", "install-bundle.sh"}
    wheel = "zstandard-0.25.0-cp312-cp312-manylinux2014_x86_64.whl"
    assert recv(None, wheel) == {"site.part00", "site.part01", "SHA256", "install-bundle.sh", wheel}
    assert (pkg / wheel).read_text() == wheel


def test_every_call_ends_with_each_engine_files_table_its_reruns_pooled(tmp_path: Path) -> None:
    """The queue's last step (here with nothing left to run): a table per engine-step file on the host, the
    Nemotron rows' second runs at 256 (session 34, `engine:V@r2`) pooled with their first from the history."""
    smi = tmp_path / "bin" / "nvidia-smi"
    smi.parent.mkdir()
    smi.write_text("#!/bin/sh\necho 'NVIDIA H200'\n")
    smi.chmod(0o755)
    state, results = tmp_path / "gpu", REPO / "replayssm_patch/gpu/results"
    (state / "done").mkdir(parents=True)
    (state / "done" / "setup").touch()  # set up already: the call runs no job
    (state / "out").mkdir()
    for name in ("engine_step-h200.json", "engine_step-h200.history.jsonl", "engine_step-h200-qwen3.5-4b.json"):
        (state / "out" / name).write_bytes((results / name).read_bytes())
    pairs = [{"order": o, "baseline_ms": 22.0 + d, "candidate_ms": 14.6 + d} for o, d in (("AB", 0.0), ("BA", 0.3))]
    clean = {"exact": True, "preemptions": 0, "valid": True, "problems": []}
    args = argparse.Namespace(candidate="replayssm_split", mode="default", prompt_tokens=1024)
    record_row(state / "out" / "engine_pair-h200.json", pair_row(args, 256, pairs, {"baseline": clean,
               "replayssm_split": clean}), PAIR_WHAT, "engine_pair ...", {})  # fmt: skip
    env = os.environ | {"PATH": f"{smi.parent}:{Path(sys.executable).parent}:/usr/bin:/bin",
                        "GPU_STATE": str(state), "OUT": str(tmp_path / "pack")}  # fmt: skip
    (tmp_path / "pack").mkdir()
    done = subprocess.run(["bash", "tools/gpu/replayssm.sh", "setup"], capture_output=True, text=True, cwd=REPO,
                          env=env)  # fmt: skip
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "engine_step-h200.json:\n" in out and "engine_step-h200-qwen3.5-4b.json:\n" in out
    assert "| default | 256 | replayssm_split | 15.24 (5.83; 2 runs) | 1.45× |" in out
    assert "plan done\n" in out
    assert (state / "out" / "engine_summary-engine_step-h200-qwen3.5-4b.md").read_text().count("| default |") >= 5
    assert "engine_pair-h200.json:\n| default | 256 | replayssm_split | 2 | 14.75 / 22.15 | 1.50× |" in out

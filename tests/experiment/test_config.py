"""Experiment config: validation errors name the key and the fix; A/A is derived; paths and ports resolve."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.errors import UserError
from harness.experiment.config import load_config, substitute, with_ports
from harness.experiment.settings_diff import arm_differences, parse_command
from tests.experiment.support import config_dict, sim_command, stand_in_nvml, write_config


def load(tmp_path: Path, document: dict[str, object]):
    return load_config(write_config(tmp_path / "c.toml", document))


def test_unknown_key_is_named(tmp_path: Path) -> None:
    document = config_dict(Path("t.parquet"))
    document["arms"]["baseline"]["comand"] = ["x"]  # type: ignore[index]
    with pytest.raises(UserError, match=r"unknown key `arms\.baseline\.comand`; remove it or fix its spelling"):
        load(tmp_path, document)


def test_bad_value_and_missing_key_are_named(tmp_path: Path) -> None:
    with pytest.raises(UserError, match=r"`order`: Input should be 'abba', 'simultaneous' or 'random'"):
        load(tmp_path, config_dict(Path("t.parquet"), order="abab"))
    document = config_dict(Path("t.parquet"))
    del document["trace"]
    with pytest.raises(UserError, match=r"missing key `trace`; add it"):
        load(tmp_path, document)
    with pytest.raises(UserError, match=r"`decision\.lag_budget_s`: Input should be greater than 0"):
        load(tmp_path, config_dict(Path("t.parquet"), decision={"lag_budget_s": -1}))


def test_arm_needs_command_or_url(tmp_path: Path) -> None:
    document = config_dict(Path("t.parquet"))
    document["arms"]["candidate"] = {"port": 8000}  # type: ignore[index]
    with pytest.raises(UserError, match=r"`arms\.candidate`: give either `command`"):
        load(tmp_path, document)


def test_unreadable_toml_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "c.toml").write_text("name = \n")
    with pytest.raises(UserError, match=r"not a readable TOML file"):
        load_config(tmp_path / "c.toml")


def test_paths_resolve_against_the_config_file(tmp_path: Path) -> None:
    config = load(tmp_path, config_dict(Path("traces/t.parquet"), quality_tasks="q.jsonl"))
    assert config.trace.path == tmp_path / "traces" / "t.parquet"
    assert config.quality_tasks == tmp_path / "q.jsonl"
    assert config.arm("baseline").cwd == tmp_path and config.mode == "A/B" and not config.is_aa


def test_aa_is_derived_and_checked(tmp_path: Path) -> None:
    document = config_dict(Path("t.parquet"))
    document["arms"]["candidate"] = "baseline"  # type: ignore[index]
    config = with_ports(load(tmp_path, document))
    assert config.is_aa and arm_differences(config) == []
    assert config.arm("candidate").port != config.arm("baseline").port  # its own port, so it can run beside
    identical = config_dict(Path("t.parquet"))
    identical["arms"]["candidate"] = dict(identical["arms"]["baseline"], port=1234)  # type: ignore[index]
    assert load(tmp_path, identical).mode == "A/A"  # placement may differ in an A/A run
    with pytest.raises(UserError, match=r"mode = 'A/A' but the arms make this an A/B experiment"):
        load(tmp_path, config_dict(Path("t.parquet"), mode="A/A"))


def test_settings_diff_flags_undeclared_differences(tmp_path: Path) -> None:
    document = config_dict(Path("t.parquet"))
    document["arms"]["candidate"]["command"] = sim_command("replayssm", "--max-num-seqs", "8")  # type: ignore[index]
    document["arms"]["candidate"]["env"] = {"EXTRA": "1"}  # type: ignore[index]
    diffs = {(d.kind, d.key): d for d in arm_differences(load(tmp_path, document))}
    assert set(diffs) == {("arg", "--policy"), ("arg", "--max-num-seqs"), ("env", "EXTRA")}
    assert diffs["arg", "--policy"].declared and not diffs["arg", "--max-num-seqs"].declared
    assert (diffs["arg", "--max-num-seqs"].baseline, diffs["arg", "--max-num-seqs"].candidate) == (None, "8")


def test_parse_command_and_substitute() -> None:
    argv = ["vllm", "serve", "models/x", "--port=8000", "-O0", "-cc", '{"a": 1}', "--enforce-eager", "--n", "-1"]
    assert parse_command(argv) == {
        "<program>": "vllm serve models/x",
        "--port": "8000",
        "-O0": None,
        "-cc": '{"a": 1}',
        "--enforce-eager": None,
        "--n": "-1",
    }
    assert substitute(["{python}", "--port", "{port}"], 9)[1:] == ("--port", "9")


def test_gpu_findings(tmp_path: Path) -> None:
    from harness.experiment.check import gpu_findings
    from harness.experiment.gpus import GpuInfo

    h200 = [GpuInfo(i, "NVIDIA H200", 143771, "580", f"GPU-{i}") for i in range(2)]
    document = config_dict(Path("t.parquet"), order="simultaneous")
    document["arms"]["baseline"]["gpus"] = [0]  # type: ignore[index]
    document["arms"]["candidate"]["gpus"] = [1]  # type: ignore[index]
    config = load(tmp_path, document)
    assert [(f.level, f.message) for f in gpu_findings(config, h200)] == [
        ("ok", "2 GPU(s) visible (0: NVIDIA H200 143771 MiB, 1: NVIDIA H200 143771 MiB)")
    ]
    mixed = [h200[0], GpuInfo(1, "NVIDIA H100 80GB HBM3", 81559, "580", "GPU-x")]
    assert "the arms get different GPUs" in gpu_findings(config, mixed)[0].message
    assert "names GPU(s) [1] but this host has [0]" in gpu_findings(config, h200[:1])[0].message
    # on a CPU box the embedded engine takes GPU ids as labels (placement is still testable); a real server cannot
    assert gpu_findings(config, None)[0].message.startswith("no GPU: the embedded engine takes arms.*.gpus as labels")
    vllm = document | {"arms": {arm: dict(document["arms"][arm]) for arm in ("baseline", "candidate")}}  # type: ignore[index]
    vllm["arms"]["baseline"]["command"] = ["vllm", "serve", "m", "--port", "{port}"]  # type: ignore[index]
    assert "none is visible" in gpu_findings(load(tmp_path, vllm), None)[0].message
    document["arms"]["candidate"]["gpus"] = [0]  # type: ignore[index]
    assert gpu_findings(load(tmp_path, document), h200)[0].message.startswith("simultaneous arms share a GPU")
    assert (
        gpu_findings(load(tmp_path, config_dict(Path("t.parquet"))), None)[0].message == "no GPU: embedded engine only"
    )


def test_check_says_where_the_energy_will_come_from(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from harness.experiment.check import energy_findings
    from harness.experiment.gpus import GpuInfo

    h200 = [GpuInfo(i, "NVIDIA H200", 143771, "580", f"GPU-{i}") for i in range(2)]
    document = config_dict(Path("t.parquet"))
    document["arms"]["baseline"]["gpus"] = [0]  # type: ignore[index]
    document["arms"]["candidate"]["gpus"] = [1]  # type: ignore[index]
    config = load(tmp_path, document)
    (finding,) = energy_findings(config, h200)  # this box: no NVML library
    assert finding.level == "warn" and finding.message.startswith("NVML energy counter not read (")
    assert "will come from power sampled once a second" in finding.message
    stand_in_nvml({0: 500.0, 1: 500.0}, monkeypatch)
    assert [(f.level, f.message) for f in energy_findings(config, h200)] == [
        ("ok", "NVML energy counter readable on GPU(s) [0, 1]")
    ]
    stand_in_nvml({0: 500.0}, monkeypatch)  # GPU 1 has no counter: named
    (finding,) = energy_findings(config, h200)
    assert finding.level == "warn" and "KeyError: 1" in finding.message
    assert energy_findings(config, None) == []  # no GPU: the GPU finding says it
    assert energy_findings(load(tmp_path, config_dict(Path("t.parquet"))), h200) == []  # arms without `gpus`

"""The host-floor model config: the 8B's layers and state sizes at toy widths, and one error line otherwise."""

from __future__ import annotations

import json
from pathlib import Path

from replayssm_patch.gpu.host_floor import main

HERE = Path(__file__).parent


def test_floor_keeps_layers_pattern_and_state_sizes_and_shrinks_the_widths(tmp_path, capsys):
    model = tmp_path / "model"
    model.mkdir()
    real = json.loads((HERE / "nemotron_h_8b_config.json").read_text())
    (model / "config.json").write_text(json.dumps(real))
    assert main(["--model", str(model), "--out", str(tmp_path / "floor")]) == 0
    floor = json.loads((tmp_path / "floor" / "config.json").read_text())
    kept = ("num_hidden_layers", "hybrid_override_pattern", "ssm_state_size", "mamba_head_dim", "head_dim")
    kept += ("vocab_size",)
    assert {k: floor[k] for k in kept} == {k: real[k] for k in kept}
    assert floor["hidden_size"] * 16 == real["hidden_size"] and floor["mamba_num_heads"] * 16 == real["mamba_num_heads"]
    assert floor["mamba_num_heads"] * floor["mamba_head_dim"] == floor["mamba_expand"] * floor["hidden_size"]
    assert "wrote the host-floor config" in capsys.readouterr().out


def test_qwen35_floor_shrinks_the_language_model_and_keeps_its_gdn_state_and_pattern(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    real = json.loads((HERE / "qwen3_5_4b_config.json").read_text())
    (model / "config.json").write_text(json.dumps(real))
    assert main(["--model", str(model), "--out", str(tmp_path / "floor")]) == 0
    floor = json.loads((tmp_path / "floor" / "config.json").read_text())
    text, real_text = floor["text_config"], real["text_config"]
    kept = ("num_hidden_layers", "layer_types", "linear_key_head_dim", "linear_value_head_dim", "head_dim",
            "vocab_size", "rope_parameters", "mamba_ssm_dtype")  # fmt: skip
    assert {k: text[k] for k in kept} == {k: real_text[k] for k in kept}
    assert (text["hidden_size"], text["linear_num_key_heads"], text["linear_num_value_heads"]) == (256, 2, 4)
    assert real_text["hidden_size"] == 10 * text["hidden_size"] and floor["architectures"] == real["architectures"]
    assert {k: v for k, v in floor.items() if k != "text_config"} == {
        k: v for k, v in real.items() if k != "text_config"
    }


def test_unsupported_model_type_is_one_error_line(tmp_path, capsys):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    assert main(["--model", str(tmp_path), "--out", str(tmp_path / "floor")]) == 2
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and "'llama' has no floor widths; supported: nemotron_h, qwen3_5" in out[0]
    assert not (tmp_path / "floor").exists(), "nothing written for a config it cannot shrink"

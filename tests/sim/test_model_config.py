"""HF-style configs -> parameter counts, KV and SSM-state bytes that match the published model shapes."""

from __future__ import annotations

import json

import pytest

from harness.errors import UserError
from harness.sim.model_config import load_model_shape
from harness.sim.state_policy import StatePolicy
from tests.sim.support import REPO

MIB = 1 << 20


def test_nemotron_h_8b_shape() -> None:
    shape = load_model_shape(REPO / "configs/models/nemotron-h-8b.json")
    assert 7.9e9 < shape.total_params < 8.3e9
    assert shape.attention.layers == 4 and shape.recurrent is not None and shape.recurrent.layers == 24
    assert shape.mlp.layers == 24
    assert shape.kv_bytes_per_token == 4 * 2 * 8 * 128 * 2
    # DESIGN §10: 128 heads x 64 x 128 state, fp32 = 4 MiB per layer per sequence
    assert shape.recurrent.state_elements * 4 == 4 * MIB


def test_qwen3_next_80b_a3b_shape() -> None:
    shape = load_model_shape(REPO / "configs/models/qwen3-next-80b-a3b.json")
    assert 78e9 < shape.total_params < 82e9
    assert 2.8e9 < shape.active_params_per_token < 3.9e9
    assert shape.attention.layers == 12 and shape.recurrent is not None
    assert shape.recurrent.kind == "gated_deltanet" and shape.recurrent.layers == 36
    assert shape.recurrent.state_elements * 4 == 2 * MIB  # 32 value heads x 128 x 128, fp32
    # MoE: one token reads only its experts' weights; a big batch touches nearly all of them
    assert shape.weight_bytes_read(1) < 0.1 * shape.weight_bytes
    assert shape.weight_bytes_read(4096) > 0.95 * shape.weight_bytes_read(10**6)


@pytest.mark.parametrize(
    "name,params,gdn_layers,attention_layers,experts",
    [  # parameter counts vLLM 0.24.0 built from these configs (../shared/research/gdn_specdecode.md A.9)
        ("qwen3.5-4b", 4.21e9, 24, 8, 0),
        ("qwen3.5-35b-a3b", 34.66e9, 30, 10, 256),
        ("qwen3-next-80b-24layer", 40.15e9, 18, 6, 512),
    ],
)
def test_gated_deltanet_shapes_of_the_h200_configs(
    name: str, params: float, gdn_layers: int, attention_layers: int, experts: int
) -> None:
    shape = load_model_shape(name)
    assert shape.total_params == pytest.approx(params, rel=0.002)
    assert shape.recurrent is not None and shape.recurrent.kind == "gated_deltanet"
    assert (shape.recurrent.layers, shape.attention.layers, shape.mlp.experts) == (
        gdn_layers,
        attention_layers,
        experts,
    )
    # vLLM's GDN page: fp32 state (32, 128, 128) + bf16 conv (3, 8192) = 2,146,304 B per layer
    assert StatePolicy("baseline").memory_bytes_per_seq(shape.recurrent) == gdn_layers * 2_146_304


def test_tied_embeddings_are_stored_once() -> None:
    shape = load_model_shape("qwen3.5-4b")
    assert shape.tied_embeddings and shape.total_params == shape.dense_params == shape.active_params_per_token


def test_a_model_is_named_by_shipped_name_config_file_or_model_directory(tmp_path) -> None:
    by_name = load_model_shape("qwen3.5-35b-a3b")
    assert load_model_shape(REPO / "configs/models/qwen3.5-35b-a3b.json") == by_name
    model_dir = tmp_path / "qwen3.5-35b-a3b"
    model_dir.mkdir()
    (model_dir / "config.json").write_text((REPO / "configs/models/qwen3.5-35b-a3b.json").read_text())
    assert load_model_shape(model_dir) == by_name


def test_unknown_model_name_lists_the_shipped_ones() -> None:
    with pytest.raises(UserError, match=r"unknown model 'qwen9'; choose one of .*qwen3\.5-4b.* or give the path"):
        load_model_shape("qwen9")


@pytest.mark.parametrize("dtype,factor", [("float32", 4), ("bfloat16", 2)])
def test_baseline_state_memory_follows_dtype(dtype: str, factor: int) -> None:
    shape = load_model_shape(REPO / "configs/models/nemotron-h-8b.json")
    rec = shape.recurrent
    assert rec is not None
    expected = rec.layers * (rec.state_elements * factor + rec.conv_elements * 2)
    assert StatePolicy("baseline", dtype).memory_bytes_per_seq(rec) == expected


def test_missing_field_is_one_clear_error(tmp_path) -> None:
    config = json.loads((REPO / "configs/models/nemotron-h-8b.json").read_text())
    del config["mamba_num_heads"]
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(config))
    with pytest.raises(UserError, match="mamba_num_heads"):
        load_model_shape(path)


def test_unknown_model_type_and_missing_file(tmp_path) -> None:
    path = tmp_path / "llama.json"
    path.write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(UserError, match="not supported"):
        load_model_shape(path)
    with pytest.raises(UserError, match="no such model config"):
        load_model_shape(tmp_path / "absent.json")

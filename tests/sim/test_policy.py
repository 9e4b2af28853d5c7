"""State policies order as DESIGN §9-10 says: ReplaySSM decodes faster, and its ring costs memory."""

from __future__ import annotations

import pytest

from harness.errors import UserError
from harness.sim.cost_model import CostModel, StepWork, load_factors
from harness.sim.engine_core import EngineCore
from harness.sim.engine_spec import EngineSpec
from harness.sim.gpus import get_gpu
from harness.sim.model_config import load_model_shape
from harness.sim.state_policy import StatePolicy
from tests.sim.support import REPO

NEMOTRON = load_model_shape(REPO / "configs/models/nemotron-h-8b.json")
DECODE_256 = StepWork(decode_seqs=256, context_tokens=256 * 1200, attention_pairs=256 * 1200)


def step_ms(policy: StatePolicy, work: StepWork = DECODE_256) -> float:
    return 1e3 * CostModel(NEMOTRON, get_gpu("h200"), policy, load_factors()).step_time(work)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_replayssm_decode_step_is_faster_than_baseline_at_batch_256(dtype: str) -> None:
    baseline = step_ms(StatePolicy("baseline", dtype))
    replay = step_ms(StatePolicy("replayssm", dtype))
    assert replay < 0.9 * baseline


def test_replayssm_saves_more_with_fp32_state() -> None:
    saving = {
        d: step_ms(StatePolicy("baseline", d)) - step_ms(StatePolicy("replayssm", d)) for d in ("float32", "bfloat16")
    }
    assert saving["float32"] > 1.5 * saving["bfloat16"] > 0


def test_split_precision_reads_less_than_fp32_replay() -> None:
    assert step_ms(StatePolicy("replayssm", "float32", split_precision=True)) < step_ms(
        StatePolicy("replayssm", "float32")
    )


def test_longer_ring_amortises_flushes_but_reads_more_ring() -> None:
    rec = NEMOTRON.recurrent
    short, long_ = StatePolicy("replayssm", buffer_len=4), StatePolicy("replayssm", buffer_len=64)
    assert long_.memory_bytes_per_seq(rec) > short.memory_bytes_per_seq(rec)
    assert short.decode_bytes_per_seq(rec) != long_.decode_bytes_per_seq(rec)


def test_prefill_cost_is_policy_independent() -> None:
    prefill = StepWork(prefill_seqs=8, prefill_tokens=8192, context_tokens=8192, attention_pairs=8 * 1024 * 512)
    assert step_ms(StatePolicy("baseline")) < step_ms(StatePolicy("baseline"), prefill)
    assert step_ms(StatePolicy("replayssm"), prefill) == pytest.approx(step_ms(StatePolicy("baseline"), prefill))


def capacity(policy: StatePolicy, gpu: str = "rtx4090") -> int:
    spec = EngineSpec(shape=NEMOTRON, gpu=get_gpu(gpu), policy=policy, factors=load_factors(), max_model_len=2048)
    return EngineCore(spec).max_concurrent_sequences


def test_ring_memory_lowers_max_concurrency() -> None:
    baseline = capacity(StatePolicy("baseline"))
    ring = capacity(StatePolicy("replayssm", buffer_len=64))
    split = capacity(StatePolicy("replayssm", buffer_len=64, split_precision=True))
    assert 0 < split < ring < baseline


def test_invalid_policy_settings_are_user_errors() -> None:
    with pytest.raises(UserError, match="--policy"):
        StatePolicy("magic")  # type: ignore[arg-type]
    with pytest.raises(UserError, match="--split-precision"):
        StatePolicy("baseline", split_precision=True)
    with pytest.raises(UserError, match="--buffer-len"):
        StatePolicy("replayssm", buffer_len=1)


def test_tensor_parallel_makes_qwen3_next_fit_and_speeds_up_decode() -> None:
    from harness.sim.engine_spec import build_spec

    config = REPO / "configs/models/qwen3-next-80b-a3b.json"
    with pytest.raises(UserError, match="--tensor-parallel-size"):
        build_spec(config, "h200", StatePolicy())
    two, four = (build_spec(config, "h200", StatePolicy(), tensor_parallel_size=tp) for tp in (2, 4))
    assert EngineCore(four).pool.capacity_bytes > EngineCore(two).pool.capacity_bytes > 0
    work = StepWork(decode_seqs=64, context_tokens=64 * 2000, attention_pairs=64 * 2000)
    assert four.cost_model().step_time(work) < two.cost_model().step_time(work)
    assert four.cost_model().features(work).comm_s > two.cost_model().features(work).comm_s > 0

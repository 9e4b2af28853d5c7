"""The step profile's summariser on a small synthetic Chrome trace (the shape torch.profiler exports for a vLLM
0.24 GPU worker), plus a real torch.profiler trace for the host side's event names and file naming."""

import gzip
import json

import pytest
import torch

from replayssm_patch.gpu.step_profile import TRACE_GLOB, profiled_tokens
from replayssm_patch.gpu.trace_summary import (
    KIND_NAMES,
    TraceError,
    kind_of,
    load_events,
    markdown,
    summarise_events,
    summarise_trace,
)
from tests.replayssm.integration.trace_fixture import GRAPH_KERNELS, STEP_US, decode_trace


def test_every_microsecond_of_a_decode_step_is_in_a_kind_or_the_gap():
    got = summarise_events(decode_trace())
    assert (got["batch"], got["steps"], got["span_us"], got["host_us"]) == (2, 3, STEP_US, 50.0)
    us = {k: v["us"] for k, v in got["kinds"].items()}  # other: the copy 2 + the RMS norm 5 + the sampler 4
    assert us == {"replayssm": pytest.approx((3 * 30 + 40) / 3, abs=0.01), "mamba": 20.0, "attention": 10.0,
                  "gemm": 100.0, "other": 11.0}  # fmt: skip
    assert got["kernel_us"] == pytest.approx(sum(us.values()), abs=0.02)
    assert got["gap_us"] == pytest.approx(STEP_US - got["kernel_us"], abs=0.02)
    assert got["kinds"]["replayssm"]["launches"] == pytest.approx(4 / 3, abs=0.01)
    assert got["kinds"]["gemm"]["share"] == pytest.approx(0.1)
    assert got["top_kernels"][0] == {"name": GRAPH_KERNELS[3][0], "kind": "gemm", "us": 100.0, "calls": 1.0}


def test_host_calls_inside_a_decode_steps_range_are_counted_by_what_they_cost_the_host():
    """Per step: one input copy and one graph launch in every range, the flush step's 9-µs sync once in three; the
    sampler's launch after the range closed is not the step's host work."""
    got = summarise_events(decode_trace())["host_calls"]
    assert got == {
        "syncs": {"per_step": 0.33, "us": 3.0},
        "copies": {"per_step": 1.0, "us": 3.0},
        "kernel_launches": {"per_step": 0.0, "us": 0.0},
        "graph_launches": {"per_step": 1.0, "us": 3.0},
    }
    assert summarise_events(decode_trace(), steps=1)["host_calls"]["syncs"] == {"per_step": 0.0, "us": 0.0}


def _host_call(name, ts, dur, cat="cuda_runtime"):
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "args": {}}


def _allocating_trace():
    """decode_trace with, in each decode step's 50-µs host range, two more launches, an allocation and a free and a
    driver-level wait; and the same calls, far heavier, in the prefill's range and between two ranges."""
    events = decode_trace()
    for t in (1000.0, 2000.0, 3000.0):  # the three batch-2 decode steps' ranges
        events += [_host_call("cudaLaunchKernel", t + 24, 2), _host_call("cudaLaunchKernel", t + 26, 2),
                   _host_call("cudaMalloc", t + 28, 8), _host_call("cudaFree", t + 36, 12),
                   _host_call("cuStreamWaitEvent", t + 48, 1, cat="cuda_driver")]  # fmt: skip
    events += [_host_call("cudaMalloc", 30.0, 900), _host_call("cudaFree", 1500.0, 900)]  # prefill; no step's range
    return events


def test_top_host_calls_name_every_cuda_call_inside_the_steps_host_ranges_heaviest_first():
    """Host time in calls no HOST_CALLS kind covers (cudaFree, cudaMalloc) shows by name, per step; the sampler's
    launches after each range closed, the prefill's allocation and a free between ranges are not the steps'."""
    got = summarise_events(_allocating_trace())
    assert got["top_host_calls"][:3] == [
        {"name": "cudaFree", "calls": 1.0, "us": 12.0},
        {"name": "cudaMalloc", "calls": 1.0, "us": 8.0},
        {"name": "cudaLaunchKernel", "calls": 2.0, "us": 4.0},
    ]
    assert sorted((c["name"], c["calls"], c["us"]) for c in got["top_host_calls"][3:]) == [
        ("cuStreamWaitEvent", 1.0, 1.0),
        ("cudaGraphLaunch", 1.0, 3.0),
        ("cudaMemcpyAsync", 1.0, 3.0),
        ("cudaStreamSynchronize", 0.33, 3.0),  # the flush step's 9-µs sync, once in three
    ]
    assert got["host_calls"]["kernel_launches"] == {"per_step": 2.0, "us": 4.0}  # the kind agrees with the name
    many = _allocating_trace() + [_host_call(f"cuEventQuery{i}", 1040.0 + i, 0.5) for i in range(8)]
    top = summarise_events(many)["top_host_calls"]
    assert len(top) == 12 and top[:7] == got["top_host_calls"] and top[7]["us"] == pytest.approx(0.17)


def test_markdown_lists_host_calls_by_name_for_rows_that_have_them():
    row = {"variant": "replayssm_fp32", "mode": "O0", **summarise_events(_allocating_trace())}
    older = {k: v for k, v in {**row, "variant": "baseline"}.items() if k != "top_host_calls"}
    md = markdown([row, older])
    table = "Host CUDA calls, replayssm_fp32 O0 batch 2 (per step):\n\n| call | calls | µs |\n|---|---|---|\n"
    assert table + "| `cudaFree` | 1.0 | 12.0 |\n| `cudaMalloc` | 1.0 | 8.0 |\n| `cudaLaunchKernel` | 2.0 | 4.0 |" in md
    assert md.count("Host CUDA calls, ") == 1 and "| baseline | O0 | 2 | 0.33 (3.0) | 1.0 (3.0) | 2.0 (4.0) |" in md
    assert md.index("CUDA calls per decode step") < md.index("Host CUDA calls, ") < md.index("Top kernels, ")


def test_steps_keeps_the_last_decode_steps_and_batch_picks_the_rows():
    last_two = summarise_events(decode_trace(), batch=2, steps=2)
    assert last_two["steps"] == 2 and last_two["kinds"]["replayssm"]["us"] == pytest.approx(50.0)  # (30+40+30)/2
    with pytest.raises(TraceError, match=r"batch 1.*\(0, 1\)"):
        summarise_events(decode_trace(), batch=1)  # the batch-1 step has no successor to bound it
    with pytest.raises(TraceError, match=r"not a vLLM 0\.24 GPU-worker trace"):
        summarise_events([e for e in decode_trace() if e.get("cat") != "user_annotation"])


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        ("_replay_step_kernel", "replayssm"),
        ("_flush_kernel", "replayssm"),
        ("_decode_fold_kernel", "replayssm"),  # the plugin's kernels by their names in the code, "replay" or not
        ("_cursor_plan_kernel", "replayssm"),
        ("_gdn_replay_kernel", "replayssm"),
        ("_gdn_fold_kernel", "replayssm"),
        ("fused_recurrent_gated_delta_rule_fwd_kernel", "mamba"),  # vLLM's GDN decode
        ("_replay_kernel_of_someone_else", "other"),
        ("_selective_scan_update_kernel", "mamba"),
        ("_causal_conv1d_update_kernel", "mamba"),
        ("_layer_norm_fwd_1pass_kernel", "mamba"),
        ("_chunk_scan_fwd_kernel", "mamba"),
        ("void flash::FlashAttnFwdSm90<cutlass::bfloat16_t, 128>", "attention"),  # cutlass inside: still attention
        ("void vllm::reshape_and_cache_flash_kernel<__nv_bfloat16>", "attention"),
        ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", "gemm"),
        ("nvjet_tst_192x128_64x4_2x1_v_bz_coopB_TNT", "gemm"),
        ("void vllm::act_and_mul_kernel<c10::BFloat16>", "other"),
    ],
)
def test_kernel_names_map_to_layer_kinds(name, kind):
    assert kind_of(name) == kind


def test_gzipped_trace_file_and_markdown(tmp_path):
    path = tmp_path / "worker_rank0.1700000000000.pt.trace.json.gz"
    with gzip.open(path, "wt") as handle:
        json.dump({"traceEvents": decode_trace(), "displayTimeUnit": "ms"}, handle)
    assert path.match(TRACE_GLOB)
    row = {"variant": "replayssm_fp32", "mode": "O0", **summarise_trace(path, 2)}
    md = markdown([row])
    assert "| replayssm_fp32 | O0 | 2 | 3 | 1000.0 | 43.3 | 20.0 | 10.0 | 100.0 | 11.0 |" in md
    assert all(k in md for k in KIND_NAMES) and f"`{GRAPH_KERNELS[3][0]}` | gemm | 100.0 | 1.0 |" in md
    assert "| replayssm_fp32 | O0 | 2 | 0.33 (3.0) | 1.0 (3.0) | 0.0 (0.0) | 1.0 (3.0) |" in md


def test_real_torch_profiler_trace_names_host_ranges_as_the_summariser_reads_them(tmp_path):
    """torch.profiler (CPU here) through the handler vLLM uses: the file matches the glob, the ranges vLLM's
    worker opens come out as user_annotation events; with no GPU there is no device op, which is said."""
    handler = torch.profiler.tensorboard_trace_handler(str(tmp_path), worker_name="rank0", use_gzip=True)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], on_trace_ready=handler):
        for name in ("execute_context_1(16)_generation_0(0)", "execute_context_0(0)_generation_1(1)"):
            with torch.profiler.record_function(name):
                torch.ones(8).sum()
    (trace,) = tmp_path.glob(TRACE_GLOB)
    ranges = [e["name"] for e in load_events(trace) if e.get("cat") == "user_annotation"]
    assert ranges == ["execute_context_1(16)_generation_0(0)", "execute_context_0(0)_generation_1(1)"]
    with pytest.raises(TraceError, match="no bounded decode step"):
        summarise_trace(trace)


def test_profiled_generate_leaves_the_asked_decode_steps_after_the_chunked_prefill():
    assert profiled_tokens(batch=256, max_num_batched_tokens=16384, steps=16, prompt_tokens=1024) == 16 + 16 + 8
    assert profiled_tokens(batch=64, max_num_batched_tokens=8192, steps=16, prompt_tokens=1024) == 8 + 16 + 8
    assert profiled_tokens(batch=256, max_num_batched_tokens=16384, steps=16, prompt_tokens=256) == 4 + 16 + 8


def test_mixed_steps_are_the_ones_prefilling_beside_decoding_whatever_their_split():
    """churn_step's selection: every bounded step with both prefilling and decoding requests; none is one line."""
    got = summarise_events(decode_trace(batch=4, mixed_steps=3), batch=4, mixed=True)
    assert got["steps"] == 3 and got["batch"] == 4
    decode = summarise_events(decode_trace(batch=4, mixed_steps=3), batch=4)
    assert decode["steps"] == 3  # the decode-only selection is unchanged by the mixed steps after it
    # churn: a decode-only step a request short of the batch (its replacement not yet in) counts from rows_from
    assert summarise_events(decode_trace(batch=4, mixed_steps=3), batch=4, rows_from=3)["steps"] == 4
    with pytest.raises(TraceError, match=r"no bounded mixed step \(prefill beside decode\); \(context, generation\)"):
        summarise_events(decode_trace(batch=4), mixed=True)

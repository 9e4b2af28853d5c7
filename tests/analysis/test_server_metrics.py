"""The server's means from two /metrics snapshots: vLLM 0.24's exposition, label sets, resets, missing series."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from harness.analysis.server_metrics import parse_snapshot, read_server_means, server_means
from harness.servers import scrape_metrics
from tests.support.vllm_metrics import Engine, exposition

BEFORE = (
    Engine(1.5, 10, 4.0, 200, 0.8, 10, 30.0, 10, 1, 210, 5000, 6, 4, 2),
    Engine(0.5, 5, 2.0, 100, 0.4, 5, 12.0, 5, 0, 105, 2500, 5, 0, 0),
)
# Over the run: engine 0 finished 8 requests (1 of them with one token), engine 1 finished 4.
AFTER = (
    Engine(1.5 + 0.8, 18, 4.0 + 2.1, 300, 0.8 + 0.14, 18, 30.0 + 16.0, 18, 2, 310, 9000, 11, 7, 5),
    Engine(0.5 + 0.4, 9, 2.0 + 1.05, 150, 0.4 + 0.08, 9, 12.0 + 8.0, 9, 0, 155, 4500, 8, 1, 0),
)


def test_vllm_exposition_gives_means_over_the_run_summed_over_engines() -> None:
    means = server_means(exposition(*BEFORE), exposition(*AFTER))
    assert means.ttft_mean_s == pytest.approx((0.8 + 0.4) / (8 + 4))
    assert means.itl_mean_s == pytest.approx((2.1 + 1.05) / (100 + 50))
    # one request of engine 0 had a single token: vLLM observed TPOT 0 for it, it is not in the mean
    assert means.tpot_mean_s == pytest.approx((0.14 + 0.08) / (8 - 1 + 4))
    assert means.e2e_mean_s == pytest.approx((16.0 + 8.0) / 12)
    assert means.generated_tokens == 100 + 50
    assert means.prompt_tokens == 4000 + 2000
    assert means.requests == (5 + 3) + (3 + 1)  # every finished_reason, both engines
    assert means.preemptions == 3
    assert means.prefix_cache_hit_rate == 0.0  # prefix caching off: nothing queried, nothing from the cache
    assert means.missing == () and means.notes == ()


def test_the_prefix_cache_hit_rate_is_cached_over_queried_prompt_tokens_over_the_run() -> None:
    idle = [0] * 14  # no request latency needed: only the cache counters move
    before = [Engine(*idle, cache_queries=1000, cache_hits=100), Engine(*idle, cache_queries=0)]
    after = [Engine(*idle, cache_queries=5000, cache_hits=2100), Engine(*idle, cache_queries=2000, cache_hits=0)]
    assert server_means(exposition(*before), exposition(*after)).prefix_cache_hit_rate == pytest.approx(2000 / 6000)


def test_parser_skips_created_samples_and_keeps_labels_apart() -> None:
    snapshot = parse_snapshot(exposition(*BEFORE))
    series = [labels for family, labels in snapshot if family == "vllm:request_success"]
    assert len(series) == 6  # 2 engines x 3 finished reasons
    assert not any(name.endswith("_created") for samples in snapshot.values() for name, _ in samples)
    engine0 = snapshot[
        ("vllm:time_to_first_token_seconds", frozenset({("model_name", "nvidia/Nemotron-H-8B"), ("engine", "0")}))
    ]
    assert engine0[("vllm:time_to_first_token_seconds_bucket", float("inf"))] == 10
    assert engine0[("vllm:time_to_first_token_seconds_sum", None)] == 1.5


def test_a_counter_reset_counts_from_zero() -> None:
    """Engine 1 restarted during the run: its series fell, so its increase is its value after the restart."""
    restarted = Engine(0.2, 2, 0.3, 20, 0.03, 2, 3.0, 2, 0, 22, 800, 2, 0, 0)
    means = server_means(exposition(*BEFORE), exposition(AFTER[0], restarted))
    assert means.generated_tokens == 100 + 22
    assert means.requests == 8 + 2
    assert means.ttft_mean_s == pytest.approx((0.8 + 0.2) / (8 + 2))
    assert means.tpot_mean_s == pytest.approx((0.14 + 0.03) / (7 + 2))


def test_missing_series_are_none_and_named() -> None:
    """A server without vLLM's latency histograms (an older or another engine) still gives its counters."""
    keep = ("vllm:generation_tokens", "vllm:prompt_tokens", "python_", "# ")

    def counters_only(text: str) -> str:
        return "\n".join(line for line in text.splitlines() if line.startswith(keep)) + "\n"

    means = server_means(counters_only(exposition(*BEFORE)), counters_only(exposition(*AFTER)))
    assert (means.generated_tokens, means.prompt_tokens) == (150, 6000)
    assert means.ttft_mean_s is means.tpot_mean_s is means.itl_mean_s is means.e2e_mean_s is None
    assert means.requests is None and means.preemptions is None
    assert means.prefix_cache_hit_rate is None  # not counted, and not named missing: servers other than vLLM
    assert set(means.missing) == {
        "vllm:time_to_first_token_seconds",
        "vllm:request_time_per_output_token_seconds",
        "vllm:inter_token_latency_seconds",
        "vllm:e2e_request_latency_seconds",
        "vllm:request_success_total",
        "vllm:num_preemptions_total",
    }


def test_older_vllm_itl_name_is_read_as_itl_never_as_tpot() -> None:
    """vLLM <= 0.10 served the per-step gap histogram as vllm:time_per_output_token_seconds (made here by
    prometheus_client, which vLLM serves its metrics with)."""
    registry = CollectorRegistry()
    gaps = Histogram("vllm:time_per_output_token_seconds", "gaps", ["model_name"], registry=registry).labels("m")
    tokens = Counter("vllm:generation_tokens", "tokens", ["model_name"], registry=registry).labels("m")
    gaps.observe(0.5)
    tokens.inc(2)
    before = generate_latest(registry).decode()
    gaps.observe(0.02)
    gaps.observe(0.04)
    tokens.inc(3)
    means = server_means(before, generate_latest(registry).decode())
    assert means.itl_mean_s == pytest.approx(0.03)
    assert means.tpot_mean_s is None and "vllm:request_time_per_output_token_seconds" in means.missing
    assert means.generated_tokens == 3


def test_snapshot_files_that_cannot_be_used_say_why(tmp_path: Path) -> None:
    before, after = tmp_path / "b.prom", tmp_path / "a.prom"
    assert read_server_means(before, after).notes == ("no /metrics snapshot b.prom", "no /metrics snapshot a.prom")
    assert not scrape_metrics("http://127.0.0.1:9", before, timeout_s=1)  # nothing listens on the discard port
    after.write_text(exposition(*AFTER))
    means = read_server_means(before, after)
    assert means.tpot_mean_s is None and len(means.notes) == 1 and "could not scrape" in means.notes[0]
    before.write_text("<html>this is not Prometheus text</html>\n")
    means = read_server_means(before, after)
    assert means.generated_tokens is None and "not Prometheus text" in means.notes[0]
    before.write_text(exposition(*BEFORE))
    assert read_server_means(before, after).generated_tokens == 150

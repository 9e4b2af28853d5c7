"""Speculative decoding per run from vLLM-shaped /metrics text (written by prometheus_client itself, as vLLM's
is), the AL a command line configures, and the acceptance-parity gate."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from harness.analysis.model import SpecDecodeRun, Speculation
from harness.analysis.server_metrics import parse_snapshots
from harness.analysis.spec_config import configured_speculation
from harness.analysis.spec_decode import acceptance_check, acceptance_reason, spec_decode_run

LABELS = ["model_name", "engine"]


class VllmMetrics:
    """The series of a vLLM 0.24 API server that spec_decode reads, with one engine."""

    def __init__(self, k: int | None) -> None:
        self.registry = CollectorRegistry()
        self.generated = Counter("vllm:generation_tokens", "", LABELS, registry=self.registry).labels("m", "0")
        self.steps = Histogram(
            "vllm:iteration_tokens_total", "", LABELS, buckets=[1, 8, 16], registry=self.registry
        ).labels("m", "0")
        self.k = k
        if k is None:
            return
        names = ("num_drafts", "num_draft_tokens", "num_accepted_tokens")
        self.counters = [
            Counter(f"vllm:spec_decode_{n}", "", LABELS, registry=self.registry).labels("m", "0") for n in names
        ]
        per_pos = Counter(
            "vllm:spec_decode_num_accepted_tokens_per_pos", "", [*LABELS, "position"], registry=self.registry
        )
        self.per_position = [per_pos.labels("m", "0", str(p)) for p in range(k)]

    def verify(self, accepted: int) -> None:
        """One verify step of one request that accepted `accepted` of its k drafts."""
        assert self.k is not None
        drafts, draft_tokens, taken = self.counters
        drafts.inc()
        draft_tokens.inc(self.k)
        taken.inc(accepted)
        for position in range(accepted):
            self.per_position[position].inc()
        self.generated.inc(1 + accepted)
        self.steps.observe(1 + accepted)

    def text(self) -> str:
        return generate_latest(self.registry).decode()


def test_acceptance_length_rates_and_throughputs_from_counter_increases() -> None:
    server = VllmMetrics(k=3)
    for accepted in (3, 3, 3):  # before the run: must not count
        server.verify(accepted)
    before = server.text()
    for accepted in (2, 1, 3, 0):
        server.verify(accepted)
    run = spec_decode_run(parse_snapshots(before, server.text()), duration_s=2.0, configured=None)
    assert (run.drafts, run.draft_tokens, run.accepted_tokens) == (4, 12, 6)
    assert run.acceptance_length == pytest.approx(1 + 6 / 4)
    assert run.acceptance_rate == pytest.approx(6 / 12)
    assert run.acceptance_by_position == pytest.approx([3 / 4, 2 / 4, 1 / 4])
    assert run.engine_steps == 4 and run.engine_steps_per_s == pytest.approx(2.0)
    assert run.emitted_throughput == pytest.approx(10 / 2.0)  # 1 + accepted per step
    assert run.processed_throughput == pytest.approx((10 + 12 - 6) / 2.0)  # plus the rejected drafts
    assert run.step_time_mean_s is None  # vLLM exposes no step duration


def test_a_server_without_speculation_has_no_acceptance_but_its_rates() -> None:
    server = VllmMetrics(k=None)
    before = server.text()
    server.generated.inc(40)
    for _ in range(40):
        server.steps.observe(1)
    run = spec_decode_run(parse_snapshots(before, server.text()), 4.0, configured=None)
    assert run.acceptance_length is None and run.acceptance_by_position == [] and run.drafts is None
    assert run.emitted_throughput == run.processed_throughput == pytest.approx(10.0)
    assert run.engine_steps_per_s == pytest.approx(10.0) and run.notes == []


def test_configured_speculation_without_counters_is_named() -> None:
    server = VllmMetrics(k=None)
    configured = Speculation(method="mtp", tokens=3, acceptance_length=3.0)
    run = spec_decode_run(parse_snapshots(server.text(), server.text()), 1.0, configured)
    assert run.acceptance_length is None and "no vllm:spec_decode_num_drafts_total" in run.notes[0]


SYNTHETIC = '"method":"mtp","num_speculative_tokens":3,"rejection_sample_method":"synthetic"'
MTP_LENGTH = ["vllm", "serve", "m", "-sc", "{" + SYNTHETIC + ',"synthetic_acceptance_length":2.8}']
MTP_RATES = [
    "vllm",
    "serve",
    "m",
    "--speculative-config={" + SYNTHETIC + ',"synthetic_acceptance_rates":[0.9,0.7,0.5]}',
]
NGRAM_IN_SHELL = [
    "bash",
    "-c",
    """vllm serve m --speculative-config '{"method": "ngram", "num_speculative_tokens": 4}'""",
]
SIM = ["{python}", "-m", "harness.sim"]


@pytest.mark.parametrize(
    ("command", "expected"),
    [
        (MTP_LENGTH, ("mtp", 3, 2.8)),
        (MTP_RATES, ("mtp", 3, 3.1)),  # unconditional rates: 1 + their sum
        (NGRAM_IN_SHELL, ("ngram", 4, None)),  # standard rejection sampling: the model decides
        ([*SIM, "--spec-tokens", "3", "--acceptance-length", "2.5"], ("synthetic (serve-sim)", 3, 2.5)),
        ([*SIM, "--spec-tokens=2"], ("synthetic (serve-sim)", 2, 3.0)),  # AL k + 1 by default
        (["vllm", "serve", "m"], None),
        (None, None),
    ],
)
def test_configured_speculation_from_the_command_line(
    command: list[str] | None, expected: tuple[str, int, float | None] | None
) -> None:
    got = configured_speculation(command)
    if expected is None:
        assert got is None
        return
    assert got is not None and (got.method, got.tokens) == expected[:2]
    assert got.acceptance_length == (None if expected[2] is None else pytest.approx(expected[2]))


def test_a_speculative_config_that_is_not_json_says_so() -> None:
    got = configured_speculation(["vllm", "serve", "m", "-sc", "{method: mtp}"])
    assert got is not None and got.acceptance_length is None and "not JSON" in got.note


def _runs(*pairs: tuple[float, float]) -> list[SpecDecodeRun]:
    """Runs with (drafts, accepted tokens) each."""
    return [SpecDecodeRun(drafts=d, accepted_tokens=a, acceptance_length=1 + a / d) for d, a in pairs]


def test_equal_acceptance_passes_and_pools_over_repeats() -> None:
    check = acceptance_check({"baseline": _runs((100, 180), (300, 560)), "candidate": _runs((200, 370))}, 0.05)
    assert check.acceptance_length["baseline"] == pytest.approx(1 + 740 / 400)  # pooled, not a mean of ratios
    assert check.matched is True and acceptance_reason(check) is None
    assert "baseline AL 2.850 vs candidate AL 2.850" in check.line


def test_acceptance_beyond_the_tolerance_refuses_a_verdict_naming_both_lengths() -> None:
    check = acceptance_check({"baseline": _runs((100, 200)), "candidate": _runs((100, 150))}, 0.05)
    reason = acceptance_reason(check)
    assert check.matched is False and reason is not None
    assert "baseline AL 3.000 vs candidate AL 2.500" in reason and "16.7% apart" in reason
    assert "same drafter" in reason and "acceptance_tolerance" in reason


def test_one_arm_speculating_is_shown_but_not_gated_and_none_is_silent() -> None:
    one = acceptance_check({"baseline": [SpecDecodeRun()], "candidate": _runs((10, 20))}, 0.05)
    assert one.matched is None and acceptance_reason(one) is None
    assert one.line.startswith("only the candidate speculates")
    neither = acceptance_check({"baseline": [SpecDecodeRun()], "candidate": [SpecDecodeRun()]}, 0.05)
    assert neither.matched is None and neither.line == ""

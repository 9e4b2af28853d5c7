"""`replaybench agree` against real loopback servers: the test upstream (token ids; one copy changes its answer to
some prompts from a known token on) and the embedded engine (text only, compared through its /tokenize)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from harness.experiment.agreement import AgreementPlan, agreement_prompts
from harness.experiment.quality import BY_TOKEN_IDS, BY_TOKENIZE, compare_answers
from tests.sim.support import start_sim
from tests.support.openai_server import diverges, upstream

REPLAYBENCH = str(Path(sys.executable).with_name("replaybench"))
REQUESTS, TOKENS, PROMPT_TOKENS, DIVERGE_EVERY, DIVERGE_AT = 24, 40, 16, 3, 17


def agree(baseline: str, candidate: str, out: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    args = ["agree", "--baseline", baseline, "--candidate", candidate, "--out", str(out), "--requests"]
    args += [str(REQUESTS), "--tokens", str(TOKENS), "--prompt-tokens", str(PROMPT_TOKENS), *extra]
    return subprocess.run([REPLAYBENCH, *args], capture_output=True, text=True, timeout=120, env=os.environ)


def changed_prompts() -> list[bool]:
    """Which of the command's prompts the diverging upstream answers differently (the upstream reads a token-id
    prompt as its ids' decimal words)."""
    plan = AgreementPlan(REQUESTS, TOKENS, PROMPT_TOKENS, 32000, 0, REQUESTS)
    return [diverges([str(t) for t in prompt], DIVERGE_EVERY) for prompt in agreement_prompts(plan)]


def test_share_and_first_divergence_by_token_ids(tmp_path: Path) -> None:
    changed = changed_prompts()
    assert 0 < sum(changed) < REQUESTS  # the seed gives both kinds, or the test would prove nothing
    with upstream() as baseline, upstream(diverge_every=DIVERGE_EVERY, diverge_at=DIVERGE_AT) as candidate:
        failed = agree(baseline, candidate, tmp_path / "ab.json")
        share = (REQUESTS - sum(changed)) / REQUESTS
        passed = agree(baseline, candidate, tmp_path / "ab-low.json", "--min-identical", repr(share))
        same = agree(baseline, baseline, tmp_path / "aa.json")
    document = json.loads((tmp_path / "ab.json").read_text())
    identical = REQUESTS - sum(changed)
    assert [t["identical"] for t in document["tasks"]] == [not c for c in changed]
    assert [t["first_divergent_token"] for t in document["tasks"]] == [DIVERGE_AT if c else None for c in changed]
    assert document["identical_requests"] == identical
    assert document["identical_fraction"] == identical / REQUESTS
    assert document["first_divergent_tokens"] == [DIVERGE_AT] * sum(changed)
    assert document["compared"] == [BY_TOKEN_IDS] and document["errors"] == document["inexact_lengths"] == 0
    assert all(t["exact_length"] and t["baseline"]["tokens"] == TOKENS for t in document["tasks"])
    assert {t["baseline"]["distinct_tokens"] for t in document["tasks"]} == {TOKENS}  # t0 .. t39: all different
    assert document["arms"]["candidate"]["median_distinct_tokens"] == TOKENS
    kept = [t for t in document["tasks"] if t["candidate"]["output"] is not None]
    assert len(kept) == sum(changed)  # outputs only where the answers differ
    assert kept[0]["candidate"]["output"].split()[DIVERGE_AT] == f"d{DIVERGE_AT}"
    assert not document["passed"] and failed.returncode == 1, failed.stderr
    assert failed.stdout.startswith(f"agreement FAIL: {identical}/{REQUESTS} requests identical")
    assert len(failed.stdout.strip().splitlines()) == 1
    assert passed.returncode == 0 and passed.stdout.startswith("agreement PASS"), passed.stdout  # at the limit
    assert same.returncode == 0 and json.loads((tmp_path / "aa.json").read_text())["identical_fraction"] == 1.0


def test_text_answers_are_compared_through_the_servers_tokenizer(tmp_path: Path) -> None:
    """The embedded engine returns no token ids: the same seed gives the same text, another seed other text."""
    sims = [start_sim("--seed", seed) for seed in ("0", "0", "1")]
    try:
        same = agree(sims[0].url, sims[1].url, tmp_path / "same.json")
        other = agree(sims[0].url, sims[2].url, tmp_path / "other.json")
    finally:
        for sim in sims:
            sim.stop()
    assert same.returncode == 0, same.stdout + same.stderr
    assert json.loads((tmp_path / "same.json").read_text())["identical_requests"] == REQUESTS
    document = json.loads((tmp_path / "other.json").read_text())
    assert other.returncode == 1 and document["identical_requests"] == 0 and document["compared"] == [BY_TOKENIZE]
    for task in document["tasks"]:
        words = [task[arm]["output"].split() for arm in ("baseline", "candidate")]
        assert task["first_divergent_token"] == next(i for i, (a, b) in enumerate(zip(*words, strict=True)) if a != b)
        assert task["exact_length"] and len(words[0]) == TOKENS


def test_token_ids_decide_even_when_texts_match() -> None:
    assert compare_answers("a b", "a b", lambda text: None, ([1, 2], [1, 3])) == (False, 1, BY_TOKEN_IDS)


def test_bad_input_is_one_line(tmp_path: Path) -> None:
    with upstream() as url:
        tiny = agree(url, url, tmp_path / "x.json", "--vocab-size", "5")
    assert tiny.returncode == 2 and tiny.stderr.startswith("error: --vocab-size 5 leaves no prompt ids")
    gone = agree("http://127.0.0.1:9", "http://127.0.0.1:9", tmp_path / "x.json")
    assert gone.returncode == 2 and gone.stderr.count("\n") == 1
    assert gone.stderr.startswith("error: http://127.0.0.1:9/v1/models did not answer (")
    assert gone.stderr.rstrip().endswith("start the server or fix the URL")
    assert not (tmp_path / "x.json").exists()


def test_failed_answers_fail_the_check_and_are_named(tmp_path: Path) -> None:
    with upstream() as baseline, upstream(mode="500", fault_every=4) as candidate:
        result = agree(baseline, candidate, tmp_path / "errors.json")
    document = json.loads((tmp_path / "errors.json").read_text())
    failed = [t for t in document["tasks"] if t["candidate"]["error"]]
    assert len(failed) == document["errors"] == REQUESTS // 4  # arrivals 0, 4, 8, ...
    assert all(not t["identical"] and not t["exact_length"] for t in failed)
    assert document["identical_requests"] == REQUESTS - len(failed) and result.returncode == 1
    assert any(
        v.startswith(f"{len(failed)} answer(s) failed, first: ") and "HTTP 500" in v for v in document["violations"]
    )

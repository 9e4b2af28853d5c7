"""Greedy cross-arm agreement: the same fixed random prompts, greedy, exactly N output tokens, on two running
servers; per request, whether the answers are identical and at which token they first differ.

Why: a change to how the state is kept (ReplaySSM's fp32 checkpoint) must not change what the model says, and
timing figures cannot show that. Prompts are random token ids, so every tokenizer (the word-level one of the
GPU runs too) takes them as they are. Answers are compared by the token ids the server returns
(vLLM's `return_token_ids`), else by text (`quality.compare_answers`). Each arm gets every request at once,
the baseline first, so both decode the same batch. The document has quality.json's shape (`tasks`, each with
`identical` and `first_divergent_token`), so the analysis scores it as it scores the quality tasks.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from harness.errors import UserError
from harness.experiment.openai_http import Answer, first_model, generate_exactly, tokenize
from harness.experiment.quality import compare_answers

FIRST_TOKEN_ID = 10  # prompt ids start here: the low ids are special tokens (pad, bos, eos, unk) in most vocabularies
WHAT = (
    "Greedy cross-arm agreement (replaybench agree): {requests} prompts of {prompt} random token ids in "
    "[{first}, {vocab}) (seed {seed}), each answered greedily with exactly {tokens} tokens (ignore_eos, "
    "min_tokens = max_tokens) by both servers, all requests at once per arm, baseline first. identical: the "
    "answers' token ids (text when a server returns no ids) are equal; first_divergent_token: index of the first "
    "differing token; distinct_tokens: distinct token ids in an answer (median per arm), which shows a trivially "
    "repetitive answer. Outputs are kept only for answers that differ."
)


@dataclass(frozen=True)
class AgreementPlan:
    """What both arms are asked."""

    requests: int
    output_tokens: int
    prompt_tokens: int
    vocab_size: int  # prompt ids are drawn below this; at most the model's vocabulary
    seed: int
    concurrency: int  # requests in flight per arm

    def check(self) -> None:
        if self.vocab_size <= FIRST_TOKEN_ID:
            raise UserError(f"--vocab-size {self.vocab_size} leaves no prompt ids above {FIRST_TOKEN_ID}; raise it")


@dataclass(frozen=True)
class ArmAnswers:
    """One arm's answers in prompt order; a string is the error of a request that failed."""

    url: str
    model: str
    answers: list[Answer | str]
    seconds: float


def agreement_prompts(plan: AgreementPlan) -> list[list[int]]:
    """`plan.requests` prompts of `plan.prompt_tokens` uniform random ids, the same for every run of one seed."""
    rng = np.random.default_rng([plan.seed, plan.prompt_tokens])
    shape = (plan.requests, plan.prompt_tokens)
    return rng.integers(FIRST_TOKEN_ID, plan.vocab_size, size=shape).tolist()


def _answer(url: str, model: str, tokens: int, timeout_s: float, prompt: list[int]) -> Answer | str:
    try:
        return generate_exactly(url, model, prompt, tokens, timeout_s)
    except UserError as error:
        return str(error)


def collect_answers(url: str, prompts: Sequence[list[int]], plan: AgreementPlan, timeout_s: float) -> ArmAnswers:
    """Every prompt's greedy answer from the server at `url`, `plan.concurrency` requests in flight."""
    model = first_model(url)
    began = time.monotonic()
    ask = functools.partial(_answer, url, model, plan.output_tokens, timeout_s)
    with ThreadPoolExecutor(max_workers=plan.concurrency) as pool:
        answers = list(pool.map(ask, prompts))
    return ArmAnswers(url, model, answers, round(time.monotonic() - began, 2))


def _tokens(answer: Answer) -> int | None:
    return len(answer.token_ids) if answer.token_ids is not None else answer.completion_tokens


def _distinct(answer: Answer | str) -> int | None:
    """Distinct token ids in an answer: a greedy answer stuck on one token agrees trivially, and this shows it."""
    return len(set(answer.token_ids)) if isinstance(answer, Answer) and answer.token_ids is not None else None


def _outcome(answer: Answer | str, keep_output: bool) -> dict[str, Any]:
    if isinstance(answer, str):
        return {"passed": None, "output": None, "tokens": None, "distinct_tokens": None, "error": answer}
    output = answer.text if keep_output else None
    return {
        "passed": None,
        "output": output,
        "tokens": _tokens(answer),
        "distinct_tokens": _distinct(answer),
        "error": None,
    }


def median_distinct_tokens(arm: ArmAnswers) -> float | None:
    """The median of the arm's answers' distinct token ids (None without token ids)."""
    counts = [n for n in map(_distinct, arm.answers) if n is not None]
    return float(np.median(counts)) if counts else None


def compare_request(index: int, baseline: ArmAnswers, candidate: ArmAnswers, tokens: int) -> dict[str, Any]:
    """One request's record in quality.json's task shape, plus what was compared and whether both lengths are
    exact; a request that failed on either arm is not identical."""
    a, b = baseline.answers[index], candidate.answers[index]
    identical, divergent, compared = False, None, None
    if isinstance(a, Answer) and isinstance(b, Answer):
        identical, divergent, compared = compare_answers(
            a.text, b.text, functools.partial(tokenize, candidate.url, candidate.model), (a.token_ids, b.token_ids)
        )
    exact = all(isinstance(x, Answer) and _tokens(x) == tokens for x in (a, b))
    return {
        "task_id": f"agree-{index}",
        "kind": "agreement",
        "baseline": _outcome(a, not identical),
        "candidate": _outcome(b, not identical),
        "identical": identical,
        "first_divergent_token": divergent,
        "compared": compared,
        "exact_length": exact,
    }


def agreement_document(plan: AgreementPlan, baseline: ArmAnswers, candidate: ArmAnswers) -> dict[str, Any]:
    """The per-request records of both arms' answers and the facts of the run (the analysis adds the score)."""
    tasks = [compare_request(i, baseline, candidate, plan.output_tokens) for i in range(plan.requests)]
    arms = {
        name: {
            "url": arm.url,
            "model": arm.model,
            "seconds": arm.seconds,
            "median_distinct_tokens": median_distinct_tokens(arm),
        }
        for name, arm in (("baseline", baseline), ("candidate", candidate))
    }
    what = WHAT.format(
        requests=plan.requests, prompt=plan.prompt_tokens, first=FIRST_TOKEN_ID, vocab=plan.vocab_size,
        seed=plan.seed, tokens=plan.output_tokens,
    )  # fmt: skip
    return {
        "what": what,
        "arms": arms,
        "requests": plan.requests,
        "output_tokens": plan.output_tokens,
        "prompt_tokens": plan.prompt_tokens,
        "vocab_size": plan.vocab_size,
        "seed": plan.seed,
        "compared": sorted({t["compared"] for t in tasks if t["compared"]}),
        "errors": sum(t[arm]["error"] is not None for t in tasks for arm in arms),
        "inexact_lengths": sum(not t["exact_length"] for t in tasks),
        "tasks": tasks,
    }

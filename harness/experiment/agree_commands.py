"""`replaybench agree`: greedy cross-arm agreement of two running servers (agreement.py), scored by the analysis.

This is the CLI layer: it scores the agreement document with `harness.analysis.quality`, the code that scores an
experiment's quality tasks, so the identical share and its limit mean the same in both places.
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

SHOWN = 16  # first divergent tokens on the summary line (the JSON has every one)


def _verdict(document: dict[str, Any], min_identical: float) -> dict[str, Any]:
    """The score of an agreement document: identical share, first divergences, and what fails the check."""
    from harness.analysis.quality import summarise_document
    from harness.records.decision_config import QualityLimits

    summary = summarise_document(document, QualityLimits(min_identical_fraction=min_identical))
    violations = list(summary.violations)
    errors = [t[arm]["error"] for t in document["tasks"] for arm in ("baseline", "candidate") if t[arm]["error"]]
    if errors:
        violations.append(f"{len(errors)} answer(s) failed, first: {errors[0]}")
    if document["inexact_lengths"]:
        wanted = document["output_tokens"]
        violations.append(f"{document['inexact_lengths']} request(s) without exactly {wanted} tokens")
    return {
        "identical_fraction": summary.identical_fraction,
        "identical_requests": sum(bool(t.identical) for t in summary.tasks),
        "first_divergent_tokens": sorted(
            t.first_divergent_token for t in summary.tasks if t.first_divergent_token is not None
        ),
        "min_identical_fraction": min_identical,
        "violations": violations,
        "passed": not violations,
    }


def summary_line(document: dict[str, Any]) -> str:
    """The one line a GPU stage's log shows."""
    share = document["identical_fraction"] or 0.0
    positions = document["first_divergent_tokens"]
    divergent = ", ".join(map(str, positions[:SHOWN])) + (
        f" (+{len(positions) - SHOWN} more)" if len(positions) > SHOWN else ""
    )
    distinct = " / ".join(str(document["arms"][arm]["median_distinct_tokens"]) for arm in ("baseline", "candidate"))
    return (
        f"agreement {'PASS' if document['passed'] else 'FAIL'}: {document['identical_requests']}/"
        f"{document['requests']} requests identical ({share:.1%}, needs {document['min_identical_fraction']:.1%}) "
        f"by {' + '.join(document['compared']) or 'nothing'}; first divergent tokens: {divergent or 'none'}; "
        f"errors {document['errors']}; inexact lengths {document['inexact_lengths']}; median distinct tokens per "
        f"answer (baseline / candidate) {distinct}"
    )


def agree(
    baseline: Annotated[str, typer.Option("--baseline", help="base URL of the baseline server")],
    candidate: Annotated[str, typer.Option("--candidate", help="base URL of the candidate server")],
    out: Annotated[Path, typer.Option("--out", "-o", help="agreement JSON to write")],
    requests: Annotated[int, typer.Option("--requests", min=1, help="prompts, each sent once to each arm")] = 64,
    tokens: Annotated[int, typer.Option("--tokens", min=1, help="exact output tokens per answer")] = 512,
    prompt_tokens: Annotated[int, typer.Option("--prompt-tokens", min=1, help="random token ids per prompt")] = 512,
    vocab_size: Annotated[
        int, typer.Option("--vocab-size", help="prompt ids are drawn below this; at most the model's vocabulary")
    ] = 32000,
    seed: Annotated[int, typer.Option("--seed", help="seed of the prompts")] = 0,
    concurrency: Annotated[
        int | None, typer.Option("--concurrency", min=1, help="requests in flight per arm [all of them]")
    ] = None,
    min_identical: Annotated[
        float, typer.Option("--min-identical", min=0.0, max=1.0, help="share of identical answers that passes")
    ] = 0.95,
    timeout: Annotated[float, typer.Option("--timeout", min=1.0, help="seconds per request")] = 600.0,
) -> None:
    """Greedy cross-arm agreement: the same random prompts, greedy, exactly --tokens tokens, on both servers; the
    share of requests whose answers are identical and each other's first divergent token (exit 1 below
    --min-identical, or on any failed or inexact answer)."""
    from harness.experiment.agreement import AgreementPlan, agreement_document, agreement_prompts, collect_answers
    from harness.experiment.quality import write_json

    plan = AgreementPlan(requests, tokens, prompt_tokens, vocab_size, seed, concurrency or requests)
    plan.check()
    prompts = agreement_prompts(plan)
    answers = [collect_answers(url, prompts, plan, timeout) for url in (baseline, candidate)]
    facts = agreement_document(plan, *answers)
    tasks = facts.pop("tasks")
    command = {"command": shlex.join(["replaybench", *sys.argv[1:]])}
    document = command | facts | _verdict(facts | {"tasks": tasks}, min_identical) | {"tasks": tasks}
    write_json(out, document)
    print(summary_line(document) + f" -> {out}")
    if not document["passed"]:
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    app.command(name="agree")(agree)

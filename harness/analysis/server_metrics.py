"""The server's own view of one run: means and counts from its `/metrics` snapshots before and after the replay.

The runner scrapes `/metrics` right before and right after every replay (warm-up requests come before the
first scrape), so the increase of each cumulative series between the two snapshots belongs to the replay
alone. A histogram's mean over the run is the increase of its `_sum` over the increase of its `_count`.
Series are summed over their label sets (`model_name`, `engine`, `finished_reason`, one per API server
process...). A series that fell between the snapshots was reset (the server restarted): its increase is
its value after, as Prometheus' `increase()` takes it.

Where vLLM 0.24 stamps each series (read in its `vllm/v1/metrics/stats.py` and `loggers.py`; every series
is held and served by the API server process, the question is whose clock produced the numbers):

- `ttft_mean_s` (`vllm:time_to_first_token_seconds`): **API server** (frontend). Wall clock when its output
  handler takes the engine core's output with the first token, minus the arrival time its renderer stamped
  before tokenizing the prompt.
- `e2e_mean_s` (`vllm:e2e_request_latency_seconds`): **API server**, the same two wall-clock stamps at the
  final output.
- `tpot_mean_s` (`vllm:request_time_per_output_token_seconds`): **engine core**. (last - first token step
  stamp) / (generated tokens - 1), one per finished request; a step stamp is the engine core's monotonic
  time when its scheduler packs that step's outputs.
- `itl_mean_s` (`vllm:inter_token_latency_seconds`): **engine core**, the difference of consecutive step
  stamps, one sample per step that gave the request tokens (a step of several tokens, e.g. speculative
  decoding, is one sample).
- `generated_tokens` (`vllm:generation_tokens_total`): counted by the API server from the token ids in the
  engine core's outputs (aborted requests' tokens included).
- `prompt_tokens` (`vllm:prompt_tokens_total`): counted by the API server from the engine core's prefill
  stats, once per request at its first token.
- `requests` (`vllm:request_success_total`): counted by the API server when a request finishes, whatever
  its `finished_reason` (stop, length, abort, ...).
- `preemptions` (`vllm:num_preemptions_total`): the engine core scheduler's preemption events, counted by
  the API server.
- `prefix_cache_hit_rate` (`vllm:prefix_cache_hits_total` / `vllm:prefix_cache_queries_total`): the engine core's
  KV-cache manager counts, per scheduled request, the prompt tokens it looked up in the prefix cache and those it
  found (a preempted request's second lookup included). No query (prefix caching off) is 0: nothing came from the
  cache. No such series (servers other than vLLM) gives None, and is not named missing.

vLLM observes a TPOT of 0 for a request with at most one generated token; those requests are taken out of
the mean with the `le="1"` bucket of `vllm:request_generation_tokens` (observed in the same place, once per
finished request). vLLM up to 0.10 named the inter-token histogram `vllm:time_per_output_token_seconds` (a
deprecated alias for some releases after, gone in 0.24; not a per-request TPOT despite its name): it is read
as ITL when the new name is absent, never as TPOT.

A metric the snapshots lack is None and named in `missing`; an unreadable or absent snapshot is None
everywhere with a note. Nothing here raises on a server's text.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

TTFT = "vllm:time_to_first_token_seconds"
TPOT = "vllm:request_time_per_output_token_seconds"
ITL_NAMES = ("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds")  # new name first
E2E = "vllm:e2e_request_latency_seconds"
GENERATION_TOKENS = "vllm:generation_tokens_total"
PROMPT_TOKENS = "vllm:prompt_tokens_total"
REQUESTS = "vllm:request_success_total"
PREEMPTIONS = "vllm:num_preemptions_total"
TOKENS_PER_REQUEST = "vllm:request_generation_tokens"
PREFIX_CACHE_QUERIES = "vllm:prefix_cache_queries_total"
PREFIX_CACHE_HITS = "vllm:prefix_cache_hits_total"

SCRAPE_FAILURE = "# replaybench: could not scrape"  # what `harness.servers.scrape_metrics` writes instead

SampleKey = tuple[str, float | None]  # (sample name, histogram bucket bound `le` or None)
Snapshot = dict[tuple[str, frozenset[tuple[str, str]]], dict[SampleKey, float]]  # (family, labels) -> samples


@dataclass(frozen=True)
class ServerMeans:
    """The server's means and counts over one run; None where its /metrics did not say (see `missing`)."""

    ttft_mean_s: float | None = None
    tpot_mean_s: float | None = None
    itl_mean_s: float | None = None
    e2e_mean_s: float | None = None
    generated_tokens: float | None = None
    prompt_tokens: float | None = None
    requests: float | None = None
    preemptions: float | None = None
    prefix_cache_hit_rate: float | None = None  # cached / queried prompt tokens
    missing: tuple[str, ...] = ()  # vLLM series absent from the snapshots
    notes: tuple[str, ...] = ()


def parse_snapshot(text: str) -> Snapshot:
    """Every sample of a Prometheus text exposition, grouped by (family, labels without `le`).

    Raises ValueError on text that is not the exposition format."""
    snapshot: Snapshot = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.endswith("_created"):
                continue  # creation timestamps, not values
            labels = dict(sample.labels)
            bound = labels.pop("le", None)
            key = (sample.name, None if bound is None else float(bound))
            snapshot.setdefault((family.name, frozenset(labels.items())), {})[key] = float(sample.value)
    return snapshot


def increase(before: Snapshot, after: Snapshot, match: Mapping[str, str] | None = None) -> dict[SampleKey, float]:
    """Per sample name and bucket: how much it grew between the snapshots, summed over label sets (only those
    carrying every label of `match`, when given).

    A series whose samples fell was reset in between and counts from zero; a series only in `before`
    vanished with a restart and adds nothing."""
    totals: dict[SampleKey, float] = {}
    for series, samples in after.items():
        if match and not match.items() <= dict(series[1]).items():
            continue
        earlier = before.get(series, {})
        reset = any(value < earlier.get(key, 0.0) for key, value in samples.items())
        for key, value in samples.items():
            totals[key] = totals.get(key, 0.0) + (value if reset else value - earlier.get(key, 0.0))
    return totals


def _mean(totals: dict[SampleKey, float], name: str, exclude: float = 0.0) -> float | None:
    count = totals.get((name + "_count", None), 0.0) - exclude
    total = totals.get((name + "_sum", None))
    return total / count if total is not None and count > 0 else None


def _hit_rate(totals: dict[SampleKey, float]) -> float | None:
    """Cached / queried prompt tokens; 0 when the server counts but looked nothing up (prefix caching off: nothing
    came from the cache), None when it does not count."""
    hits, queries = totals.get((PREFIX_CACHE_HITS, None)), totals.get((PREFIX_CACHE_QUERIES, None))
    if hits is None or queries is None:
        return None
    return hits / queries if queries > 0 else 0.0


@dataclass(frozen=True)
class Snapshots:
    """One run's two parsed snapshots; both None, with `notes` saying why, when either cannot be used."""

    before: Snapshot | None
    after: Snapshot | None
    notes: tuple[str, ...] = ()

    def increase(self, match: Mapping[str, str] | None = None) -> dict[SampleKey, float] | None:
        """`increase` over the run, or None without usable snapshots."""
        if self.before is None or self.after is None:
            return None
        return increase(self.before, self.after, match)


def parse_snapshots(before_text: str, after_text: str) -> Snapshots:
    """Both snapshots of a run from their text; text that is not the exposition format gives a note."""
    try:
        return Snapshots(parse_snapshot(before_text), parse_snapshot(after_text))
    except ValueError as error:
        return Snapshots(None, None, (f"a /metrics snapshot is not Prometheus text ({error})",))


def server_means(before_text: str, after_text: str) -> ServerMeans:
    """Means and counts over the run from the text of two snapshots (before, after)."""
    return means_of(parse_snapshots(before_text, after_text))


def means_of(snapshots: Snapshots) -> ServerMeans:
    """Means and counts over the run from its parsed snapshots."""
    totals = snapshots.increase()
    if totals is None:
        return ServerMeans(notes=snapshots.notes)
    present = {name for name, _ in totals}
    itl = next((name for name in ITL_NAMES if name + "_count" in present), ITL_NAMES[0])
    wanted = {
        "ttft": TTFT + "_count",
        "tpot": TPOT + "_count",
        "itl": itl + "_count",
        "e2e": E2E + "_count",
        "generated": GENERATION_TOKENS,
        "prompt": PROMPT_TOKENS,
        "requests": REQUESTS,
        "preemptions": PREEMPTIONS,
    }
    missing = tuple(sample.removesuffix("_count") for sample in wanted.values() if sample not in present)
    notes = []
    single_token = totals.get((TOKENS_PER_REQUEST + "_bucket", 1.0))
    if TPOT + "_count" in present and single_token is None:
        notes.append(f"no {TOKENS_PER_REQUEST} histogram: requests with one generated token count as TPOT 0")
    return ServerMeans(
        ttft_mean_s=_mean(totals, TTFT),
        tpot_mean_s=_mean(totals, TPOT, exclude=single_token or 0.0),
        itl_mean_s=_mean(totals, itl),
        e2e_mean_s=_mean(totals, E2E),
        generated_tokens=totals.get((GENERATION_TOKENS, None)),
        prompt_tokens=totals.get((PROMPT_TOKENS, None)),
        requests=totals.get((REQUESTS, None)),
        preemptions=totals.get((PREEMPTIONS, None)),
        prefix_cache_hit_rate=_hit_rate(totals),
        missing=missing,
        notes=tuple(notes),
    )


def _snapshot_text(path: Path) -> tuple[str | None, str]:
    """(text, "") or (None, why it cannot be used)."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None, f"no /metrics snapshot {path.name}"
    if text.startswith(SCRAPE_FAILURE):
        return None, text.splitlines()[0].removeprefix("# replaybench: ")
    return text, ""


def read_snapshots(before: Path, after: Path) -> Snapshots:
    """Both snapshot files of a run, parsed; a missing or failed scrape gives None and a note."""
    (before_text, before_note), (after_text, after_note) = _snapshot_text(before), _snapshot_text(after)
    if before_text is None or after_text is None:
        return Snapshots(None, None, tuple(note for note in (before_note, after_note) if note))
    return parse_snapshots(before_text, after_text)


def read_server_means(before: Path, after: Path) -> ServerMeans:
    """`server_means` of two snapshot files; a missing or failed scrape gives None everywhere and a note."""
    return means_of(read_snapshots(before, after))

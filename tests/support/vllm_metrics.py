"""A vLLM 0.24 API server's /metrics text with chosen cumulative values, for the server cross-check tests."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Engine:
    """Cumulative values of one engine's series (vLLM labels them model_name and engine)."""

    ttft_sum: float
    ttft_count: int
    itl_sum: float
    itl_count: int
    tpot_sum: float
    tpot_count: int
    e2e_sum: float
    e2e_count: int
    one_token: int  # finished requests with <= 1 generated token (TPOT observed as 0)
    generated: int
    prompt: int
    stop: int
    length: int
    preempted: int
    cache_queries: int = 0  # prompt tokens looked up in the prefix cache
    cache_hits: int = 0  # ... and found there


# What a vLLM 0.24 API server serves, trimmed to the series read plus some that must be skipped (Python's,
# gauges, `_created`), bucket lists shortened. Blocks are families; `{e}` is the engine index and
# each family lists every engine's samples in turn, as prometheus_client writes them.
LABELS = 'model_name="nvidia/Nemotron-H-8B",engine="{e}"'  # stands for <L>
FAMILIES = """\
# HELP python_gc_objects_collected_total Objects collected during gc
# TYPE python_gc_objects_collected_total counter
python_gc_objects_collected_total{{generation="{e}"}} 25313.0

# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{{<L>}} 3.0

# HELP vllm:num_preemptions_total Cumulative number of preemption from the engine.
# TYPE vllm:num_preemptions_total counter
vllm:num_preemptions_total{{<L>}} {x.preempted}.0
vllm:num_preemptions_created{{<L>}} 1.7648e+09

# HELP vllm:prefix_cache_queries_total Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{{<L>}} {x.cache_queries}.0
vllm:prefix_cache_queries_created{{<L>}} 1.7648e+09

# HELP vllm:prefix_cache_hits_total Prefix cache hits, in terms of number of cached tokens.
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{{<L>}} {x.cache_hits}.0
vllm:prefix_cache_hits_created{{<L>}} 1.7648e+09

# HELP vllm:prompt_tokens_total Number of prefill tokens processed.
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{{<L>}} {x.prompt}.0
vllm:prompt_tokens_created{{<L>}} 1.7648e+09

# HELP vllm:generation_tokens_total Number of generation tokens processed.
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{{<L>}} {x.generated}.0
vllm:generation_tokens_created{{<L>}} 1.7648e+09

# HELP vllm:request_success_total Count of successfully processed requests.
# TYPE vllm:request_success_total counter
vllm:request_success_total{{<L>,finished_reason="stop"}} {x.stop}.0
vllm:request_success_total{{<L>,finished_reason="length"}} {x.length}.0
vllm:request_success_total{{<L>,finished_reason="abort"}} 0.0

# HELP vllm:request_generation_tokens Number of generation tokens processed.
# TYPE vllm:request_generation_tokens histogram
vllm:request_generation_tokens_bucket{{<L>,le="1.0"}} {x.one_token}.0
vllm:request_generation_tokens_bucket{{<L>,le="2.0"}} {x.one_token}.0
vllm:request_generation_tokens_bucket{{<L>,le="+Inf"}} {x.tpot_count}.0
vllm:request_generation_tokens_count{{<L>}} {x.tpot_count}.0
vllm:request_generation_tokens_sum{{<L>}} {x.generated}.0
vllm:request_generation_tokens_created{{<L>}} 1.7648e+09

# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{{<L>,le="0.001"}} 0.0
vllm:time_to_first_token_seconds_bucket{{<L>,le="+Inf"}} {x.ttft_count}.0
vllm:time_to_first_token_seconds_count{{<L>}} {x.ttft_count}.0
vllm:time_to_first_token_seconds_sum{{<L>}} {x.ttft_sum!r}
vllm:time_to_first_token_seconds_created{{<L>}} 1.7648e+09

# HELP vllm:inter_token_latency_seconds Histogram of inter-token latency in seconds.
# TYPE vllm:inter_token_latency_seconds histogram
vllm:inter_token_latency_seconds_bucket{{<L>,le="0.01"}} 0.0
vllm:inter_token_latency_seconds_bucket{{<L>,le="+Inf"}} {x.itl_count}.0
vllm:inter_token_latency_seconds_count{{<L>}} {x.itl_count}.0
vllm:inter_token_latency_seconds_sum{{<L>}} {x.itl_sum!r}

# HELP vllm:request_time_per_output_token_seconds Histogram of time_per_output_token_seconds per request.
# TYPE vllm:request_time_per_output_token_seconds histogram
vllm:request_time_per_output_token_seconds_bucket{{<L>,le="0.01"}} 0.0
vllm:request_time_per_output_token_seconds_bucket{{<L>,le="+Inf"}} {x.tpot_count}.0
vllm:request_time_per_output_token_seconds_count{{<L>}} {x.tpot_count}.0
vllm:request_time_per_output_token_seconds_sum{{<L>}} {x.tpot_sum!r}

# HELP vllm:e2e_request_latency_seconds Histogram of e2e request latency in seconds.
# TYPE vllm:e2e_request_latency_seconds histogram
vllm:e2e_request_latency_seconds_bucket{{<L>,le="0.3"}} 0.0
vllm:e2e_request_latency_seconds_bucket{{<L>,le="+Inf"}} {x.e2e_count}.0
vllm:e2e_request_latency_seconds_count{{<L>}} {x.e2e_count}.0
vllm:e2e_request_latency_seconds_sum{{<L>}} {x.e2e_sum!r}
"""


def exposition(*engines: Engine) -> str:
    """The text of a server with these engines: per family its HELP/TYPE lines, then each engine's samples."""
    out = []
    for block in FAMILIES.split("\n\n"):
        lines = block.strip().splitlines()
        header = [line for line in lines if line.startswith("#")]
        samples = "\n".join(line for line in lines if not line.startswith("#"))
        out += header + [samples.replace("<L>", LABELS).format(e=i, x=x) for i, x in enumerate(engines)]
    return "\n".join(out) + "\n"

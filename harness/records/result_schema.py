"""Per-request results of one replay (one arm, one repeat): DESIGN §2 "Result"."""

from __future__ import annotations

import pyarrow as pa

RESULT_SCHEMA_VERSION = "3"  # 2: token_counts + token_count_source (tokens counted by the server); 3: tenant
RESULT_KIND = "result"

RESULT_SCHEMA = pa.schema(
    [
        pa.field("request_id", pa.string(), nullable=False),
        pa.field("arm", pa.string(), nullable=False),
        pa.field("repeat", pa.int32(), nullable=False),
        pa.field("intended_s", pa.float64(), nullable=False),
        pa.field("sent_s", pa.float64()),
        pa.field("lag_s", pa.float64()),
        pa.field("status", pa.int16()),
        pa.field("error", pa.string()),
        pa.field("ttft_s", pa.float64()),
        pa.field("e2e_s", pa.float64()),
        pa.field("token_times", pa.list_(pa.float32())),
        pa.field("token_counts", pa.list_(pa.int16())),
        pa.field("token_count_source", pa.string()),
        pa.field("output_tokens", pa.int32()),
        pa.field("output_tokens_usage", pa.int32()),
        pa.field("expected_output_tokens", pa.int32()),
        pa.field("prompt_tokens", pa.int32()),
        pa.field("prompt_tokens_server", pa.int32()),
        pa.field("tenant", pa.string()),  # the trace's tenant (who sent it), for per-tenant segments
        pa.field("finish_reason", pa.string()),
        pa.field("worker", pa.int16()),
        pa.field("output_text", pa.string()),
    ]
)

# How a row's tokens were counted (column `token_count_source`; harness/replay/stream_parse.py explains).
CONTINUOUS_USAGE, FINAL_USAGE, CHUNKS = "continuous_usage", "final_usage", "chunks"
# Schema 1 files counted only chunks with non-empty text, so their TPOT/ITL are superseded.
TEXT_CHUNKS = "text_chunks"
TOKEN_COUNT_SOURCES = (CONTINUOUS_USAGE, FINAL_USAGE, CHUNKS, TEXT_CHUNKS)

# Error classes a request can end in (column `error`; null means success).
ERROR_CLASSES = ("connect", "timeout", "http_4xx", "http_5xx", "http_429", "broken_stream", "client_queue")

# File metadata keys of a result file.
META_ARM = "replaybench.arm"
META_REPEAT = "replaybench.repeat"
META_COMPLETE = "replaybench.complete"  # "true" once every scheduled request finished
META_URL = "replaybench.url"
META_TIME_SCALE = "replaybench.time_scale"
META_OFFERED_RATE = "replaybench.offered_rate"
META_TRACE_SOURCE = "replaybench.trace"
META_SIMULATED = "replaybench.simulated"  # "true" when produced by the embedded engine
META_LOAD_SHARE = "replaybench.load_share"  # optional: the offered load as a share of the baseline's capacity
META_CAPACITY_SOURCE = "replaybench.capacity_source"  # optional: where that capacity came from (a capacity.json, ...)
META_WORKER_LOADS = "replaybench.worker_loads"  # JSON: each replay worker's receive lag and CPU share
META_GPUS = "replaybench.gpus"  # GPU ids (CUDA_VISIBLE_DEVICES) of the server in this repeat; "" when not placed
META_T0_MONOTONIC = "replaybench.t0_monotonic"  # time.monotonic() of trace time 0 (system-wide on Linux)
META_T0_UNIX = "replaybench.t0_unix"  # the same instant on the wall clock (time.time())
# Every request of the run carried `X-Request-Id: <prefix><request_id, percent-quoted>` (harness/replay/client.py)
META_REQUEST_ID_PREFIX = "replaybench.request_id_prefix"

"""Per-request results of one replay (one arm, one repeat): DESIGN §2 "Result"."""

from __future__ import annotations

import pyarrow as pa

RESULT_SCHEMA_VERSION = "1"
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
        pa.field("output_tokens", pa.int32()),
        pa.field("output_tokens_usage", pa.int32()),
        pa.field("expected_output_tokens", pa.int32()),
        pa.field("prompt_tokens", pa.int32()),
        pa.field("prompt_tokens_server", pa.int32()),
        pa.field("finish_reason", pa.string()),
        pa.field("worker", pa.int16()),
        pa.field("output_text", pa.string()),
    ]
)

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
META_LOAD_SHARE = "replaybench.load_share"  # the offered load as a share of the baseline's capacity (0.65 = 65 %)
META_GPUS = "replaybench.gpus"  # GPU ids (CUDA_VISIBLE_DEVICES) of the server in this repeat; "" when not placed

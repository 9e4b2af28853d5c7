"""A synthetic Chrome trace of a vLLM 0.24 GPU worker, as torch.profiler exports it (no pytest, no torch): shared
by the summariser's tests and the engine-flow check that runs in the vLLM venv."""

STEP_US = 1000.0
GRAPH_KERNELS = (  # (name, µs) of one decode step's CUDA graph, Nemotron-H-like names
    ("_replay_step_kernel", 30.0),
    ("_selective_scan_update_kernel", 20.0),
    ("void flash::FlashAttnFwdSm90<cutlass::bfloat16_t>", 10.0),
    ("nvjet_tst_128x256_64x4_1x2_h_bz_coopA_TNN", 100.0),
    ("void vllm::rms_norm_kernel<c10::BFloat16>", 5.0),
)


class TraceBuilder:
    """Events as torch.profiler writes them: host ranges and launches on the CPU clock, device ops with the
    launch's correlation id on the GPU timeline."""

    def __init__(self):
        self.events = [{"ph": "M", "name": "process_name", "args": {"name": "python"}}]
        self.correlation = 0

    def launch(self, host_ts, name="cudaLaunchKernel", dur=3):
        self.correlation += 1
        self.events.append({"ph": "X", "cat": "cuda_runtime", "name": name, "ts": host_ts, "dur": dur,
                            "args": {"correlation": self.correlation}})  # fmt: skip
        return self.correlation

    def device(self, name, ts, dur, correlation, cat="kernel"):
        self.events.append({"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur,
                            "args": {"correlation": correlation, "stream": 7}})  # fmt: skip

    def step(self, host_ts, gpu_ts, context, generation, flush=False, sync_us=0.0):
        name = f"execute_context_{context}({context * 1024})_generation_{generation}({generation})"
        self.events.append({"ph": "X", "cat": "user_annotation", "name": name, "ts": host_ts, "dur": 50.0})
        copy = self.launch(host_ts + 5, "cudaMemcpyAsync")
        self.device("Memcpy HtoD (Pinned -> Device)", gpu_ts, 2.0, copy, cat="gpu_memcpy")
        if sync_us:  # the host blocked inside the range until the GPU caught up
            self.launch(host_ts + 10, "cudaStreamSynchronize", dur=sync_us)
        graph = self.launch(host_ts + 20, "cudaGraphLaunch")
        at = gpu_ts + 10
        kernels = [*GRAPH_KERNELS, *((("_flush_kernel", 40.0),) if flush else ())]
        for name, dur in kernels:
            self.device(name, at, dur, graph)
            at += dur + 1
        # the sampler, launched after the range closed (async scheduling), still runs inside this step's span
        self.device("void at::native::reduce_kernel<ArgMaxOps>", gpu_ts + 300, 4.0, self.launch(host_ts + 80))


def decode_trace(batch: int = 2, decode_steps: int = 3, mixed_steps: int = 0):
    """A prefill, `decode_steps` decode steps at `batch` (the second one flushes and its host blocks in a 9-µs
    sync), and a step after one request ended; with `mixed_steps`, that many steps prefilling one request beside
    batch - 1 decoding ones follow (churn_step.py's), then a last step that bounds them."""
    t = TraceBuilder()
    t.step(0.0, 100.0, context=batch, generation=0)
    for k in range(decode_steps):
        t.step(
            1000.0 * (k + 1), 1100.0 + STEP_US * k, context=0, generation=batch, flush=k == 1, sync_us=9.0 * (k == 1)
        )
    t.step(1000.0 * (decode_steps + 1), 1100.0 + STEP_US * decode_steps, context=0, generation=batch - 1)
    first = decode_steps + 2
    for k in range(mixed_steps + (mixed_steps > 0)):
        context = 1 if k < mixed_steps else 0
        t.step(1000.0 * (first + k), 1100.0 + STEP_US * (first - 1 + k), context=context, generation=batch - 1)
    return t.events

"""What the machine did while a run replayed: the evidence that a slow repeat was the host or the GPU, not the arm.

Why: on the H200 (2026-12-03) both arms of an A/B slowed ~2x over seven minutes and nothing in the servers' own
metrics said why. Every run now keeps, sampled once a second while it replays, the host's CPU busy and steal
shares and its load (psutil), and per GPU of the arm its SM clock against the maximum, power, temperature,
utilisation, memory clock and HBM temperature (one ``nvidia-smi --query-gpu ... --loop-ms`` process for the whole
run: no process per sample), and each GPU's cumulative energy counter through NVML (energy_counter.py: exact
where the power samples cover a quarter of the time). Without nvidia-smi (a laptop, CI, the embedded engine) only
the host is sampled. Given the arm's server, its load gauges are sampled too (server_gauges.py).
The file is written when the replay ends, also when it failed; sampling never fails a run.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType

import psutil

from harness.atomic import atomic_path
from harness.experiment.energy_counter import EnergyCounters
from harness.experiment.server_gauges import scrape_gauges

INTERVAL_S = 1.0
# nvidia-smi's names, in the order of GPU_KEYS (the keys the file and the analysis use)
# (the memory clock and HBM temperature: session 23's fp32 ReplaySSM arms, memory-bound, slowed by repeat on one host
# where the SM clock could not say why)
GPU_QUERY = ("index", "clocks.sm", "clocks.max.sm", "power.draw", "temperature.gpu", "utilization.gpu", "clocks.mem",
             "temperature.memory")  # fmt: skip
GPU_KEYS = ("index", "sm_mhz", "max_sm_mhz", "power_w", "temperature_c", "utilization_pct", "mem_mhz",
            "memory_temperature_c")  # fmt: skip


def parse_gpu_line(line: str, t_s: float) -> dict[str, float | None] | None:
    """One ``nvidia-smi --format=csv,noheader,nounits`` line as a sample; None for a line that is not one (an
    error message). A field the GPU does not report ("[N/A]", "[Not Supported]") is None."""
    parts = [part.strip() for part in line.split(",")]
    if len(parts) != len(GPU_QUERY):
        return None
    sample: dict[str, float | None] = {"t_s": round(t_s, 3)}
    for key, text in zip(GPU_KEYS, parts, strict=True):
        try:
            sample[key] = float(text)
        except ValueError:
            if key == "index":
                return None
            sample[key] = None
    return sample


class RunTelemetry:
    """A context manager sampling host and GPUs from entry to exit, then writing them to ``path`` as JSON."""

    def __init__(
        self,
        path: Path,
        gpus: Sequence[int] = (),
        interval_s: float = INTERVAL_S,
        server_url: str | None = None,
        server_interval_s: float = INTERVAL_S,
    ) -> None:
        """`server_url`: the arm's server, whose load gauges are read every `server_interval_s` (each read costs
        the server a /metrics render; see ReplaySettings.server_gauges_s)."""
        self.path, self.gpus, self.interval_s, self.server_interval_s = path, list(gpus), interval_s, server_interval_s
        self.metrics_url = None if server_url is None else server_url.rstrip("/") + "/metrics"
        self.server: list[dict[str, float]] = []
        self.server_error: str | None = (
            None if server_url else "server load not sampled (no server, or [replay] server_gauges_s = 0)"
        )
        self.nvidia_smi = shutil.which("nvidia-smi")
        self.host: list[dict[str, float]] = []
        self.gpu: list[dict[str, float | None]] = []
        self.gpu_error: str | None = None if self.nvidia_smi else "nvidia-smi not found: GPUs not sampled"
        self.energy: list[dict[str, float]] = []
        self._counters: EnergyCounters | None = None  # opened with the GPU sampler; its `error` says why not read
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._smi: subprocess.Popen[str] | None = None
        self._began = 0.0
        self._began_unix = 0.0

    def __enter__(self) -> RunTelemetry:
        self._began, self._began_unix = time.monotonic(), time.time()
        psutil.cpu_times_percent(interval=None)  # the first call only sets the reference point
        self._threads.append(threading.Thread(target=self._sample_host, name="telemetry-host", daemon=True))
        if self.nvidia_smi:
            self._start_gpu_sampler()
            self._start_energy_sampler()
        if self.metrics_url:
            self._threads.append(threading.Thread(target=self._sample_server, name="telemetry-server", daemon=True))
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self._stop.set()
        if self._smi is not None:
            self._smi.terminate()
        for thread in self._threads:
            thread.join(timeout=5)
        if self._smi is not None:
            self._smi.wait(timeout=5)
        self._host_sample()  # the tail since the last sample: a run shorter than the interval gets one too
        if self._counters is not None and self._counters.handles:
            self._energy_sample()  # the counter at the end, so a window ending after the last tick is bracketed
            self._counters.close()  # (its `error` stays)
        energy_error = None if self._counters is None else self._counters.error
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # t0_unix: the wall clock at t_s = 0, so samples line up with a result file's replaybench.t0_unix
        payload = {"interval_s": self.interval_s, "server_interval_s": self.server_interval_s,
                   "t0_unix": self._began_unix, "gpus": self.gpus, "host": self.host,
                   "gpu": self.gpu, "gpu_error": self.gpu_error, "energy": self.energy,
                   "energy_error": energy_error, "server": self.server,
                   "server_error": self.server_error}  # fmt: skip
        with atomic_path(self.path) as tmp:
            tmp.write_text(json.dumps(payload) + "\n")

    def _now(self) -> float:
        return time.monotonic() - self._began

    def _sample_host(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._host_sample()

    def _host_sample(self) -> None:
        """The host's CPU shares since the previous sample, and its load now."""
        shares = psutil.cpu_times_percent(interval=None)
        busy = 100.0 - shares.idle - getattr(shares, "iowait", 0.0)
        steal = getattr(shares, "steal", 0.0)  # Linux only
        self.host.append(
            {
                "t_s": round(self._now(), 3),
                "cpu_busy_pct": round(busy, 2),
                "cpu_steal_pct": round(steal, 2),
                "load1": round(os.getloadavg()[0], 2),
            }
        )

    def _sample_server(self) -> None:
        """The server's load gauges once an interval; a failed scrape is named (the last reason kept), not raised."""
        assert self.metrics_url is not None
        while not self._stop.wait(self.server_interval_s):
            values, error = scrape_gauges(self.metrics_url, timeout_s=min(self.server_interval_s, 5.0))
            if values is None:
                self.server_error = error
            else:
                self.server.append({"t_s": round(self._now(), 3), **values})

    def _start_gpu_sampler(self) -> None:
        command = [str(self.nvidia_smi), f"--query-gpu={','.join(GPU_QUERY)}", "--format=csv,noheader,nounits",
                   f"--loop-ms={round(self.interval_s * 1000)}"]  # fmt: skip
        if self.gpus:
            command.append(f"--id={','.join(map(str, self.gpus))}")
        try:
            self._smi = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        except OSError as exc:
            self.gpu_error = f"nvidia-smi did not start: {exc}"
            return
        self._threads.append(threading.Thread(target=self._read_gpu, name="telemetry-gpu", daemon=True))

    def _start_energy_sampler(self) -> None:
        self._counters = EnergyCounters(self.gpus)
        if self._counters.handles:
            self._energy_sample()  # the counter at the start
            self._threads.append(threading.Thread(target=self._sample_energy, name="telemetry-energy", daemon=True))

    def _sample_energy(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._energy_sample()

    def _energy_sample(self) -> None:
        """Every GPU's counter now; a failed read keeps its reason in the counters (the power samples then stand in)."""
        assert self._counters is not None
        t_s = round(self._now(), 3)
        readings = self._counters.read()
        self.energy.extend({"t_s": t_s, "index": float(gpu), "energy_mj": mj} for gpu, mj in readings.items())

    def _read_gpu(self) -> None:
        assert self._smi is not None and self._smi.stdout is not None
        for line in self._smi.stdout:
            sample = parse_gpu_line(line, self._now())
            if sample is not None:
                self.gpu.append(sample)
            elif not self._stop.is_set() and line.strip():
                self.gpu_error = f"nvidia-smi: {line.strip()[:200]}"

"""Layout of a run directory (DESIGN §2): one place that names every file, so writers and readers agree."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class RunDir:
    """Paths inside `reports/<experiment>-<timestamp>/`. A run directory is self-describing."""

    root: Path

    @property
    def experiment_toml(self) -> Path:
        return self.root / "experiment.toml"

    @property
    def env_json(self) -> Path:
        return self.root / "env.json"

    @property
    def results_dir(self) -> Path:
        return self.root / "results"

    def result(self, arm: str, repeat: int) -> Path:
        """The accepted result of one arm and repeat."""
        return self.results_dir / f"{arm}-r{repeat}.parquet"

    def attempt(self, arm: str, repeat: int, attempt: int) -> Path:
        """A retried attempt kept for the record (never analysed as a replicate)."""
        return self.root / "attempts" / f"{arm}-r{repeat}-a{attempt}.parquet"

    def server_log(self, arm: str, repeat: int) -> Path:
        return self.root / "servers" / f"{arm}-r{repeat}.log"

    def metrics(self, arm: str, repeat: int, when: str) -> Path:
        """Scraped Prometheus text; `when` is "before" or "after" the replay."""
        return self.root / "metrics" / f"{arm}-r{repeat}.{when}.prom"

    def telemetry(self, arm: str, repeat: int) -> Path:
        """Host and GPU samples taken while the run replayed (experiment/telemetry.py); the last attempt's."""
        return self.root / "telemetry" / f"{arm}-r{repeat}.json"

    @property
    def attempts_json(self) -> Path:
        """Every attempt (accepted, retried, crashed, invalid) with its reason."""
        return self.root / "attempts.json"

    @property
    def quality_json(self) -> Path:
        return self.root / "quality.json"

    @property
    def summary_json(self) -> Path:
        return self.root / "summary.json"

    @property
    def decision_json(self) -> Path:
        return self.root / "decision.json"

    @property
    def index_html(self) -> Path:
        return self.root / "index.html"

    @property
    def summary_md(self) -> Path:
        return self.root / "summary.md"

    @property
    def junit_xml(self) -> Path:
        return self.root / "junit.xml"

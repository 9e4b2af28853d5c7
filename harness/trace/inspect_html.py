"""`inspect --html`: one self-contained page (inline PNG figures, no network) describing a trace."""

from __future__ import annotations

import base64
import io
from pathlib import Path

import numpy as np

from harness.atomic import atomic_path
from harness.errors import UserError
from harness.trace.model import Trace
from harness.trace.stats import MINUTE_S, TraceStats, requests_per_window, summary_rows

TEMPLATE = "inspect.html.j2"
HIST_BINS = 50


def _figure_png(fig) -> str:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=100, bbox_inches="tight")
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def _figures(trace: Trace) -> dict[str, str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figures = {}
    per_minute = requests_per_window(trace.arrivals.to_numpy(), MINUTE_S)
    fig, ax = plt.subplots(figsize=(9, 3))
    ax.step(np.arange(len(per_minute)), per_minute / MINUTE_S, where="post")
    ax.set_xlabel("minute of the trace")
    ax.set_ylabel("arrival rate (req/s)")
    ax.set_title("Arrival rate per minute")
    figures["arrivals"] = _figure_png(fig)
    plt.close(fig)
    for column, title in (("prompt_tokens", "Prompt length"), ("output_tokens", "Output length")):
        fig, ax = plt.subplots(figsize=(4.5, 3))
        ax.hist(trace.table.column(column).to_numpy(), bins=HIST_BINS)
        ax.set_xlabel("tokens")
        ax.locator_params(axis="x", nbins=5)
        ax.set_ylabel("requests")
        ax.set_title(title)
        figures[column] = _figure_png(fig)
        plt.close(fig)
    return figures


def write_inspect_html(trace: Trace, stats: TraceStats, path: Path, title: str) -> Path:
    import jinja2

    env = jinja2.Environment(loader=jinja2.FileSystemLoader(Path(__file__).parent), autoescape=True)
    page = env.get_template(TEMPLATE).render(title=title, rows=summary_rows(stats), figures=_figures(trace))
    path = Path(path)
    try:
        with atomic_path(path) as tmp:
            tmp.write_text(page, encoding="utf-8")
    except OSError as exc:
        raise UserError(f"{path}: cannot write the page ({exc.strerror}); choose a writable path") from None
    return path

"""`make demo`: a paired experiment on the embedded engine (no GPU): baseline vs the ReplaySSM policy,
5 repeats in ABBA order on a slice of the Azure conversation trace at 65 % of the baseline's capacity (simulated in
virtual time first), then the HTML report.

The same as `replaybench run --config configs/demo.toml`; it ends by printing where the report is.
"""

from __future__ import annotations

import sys
from pathlib import Path

from harness.errors import UserError

REPO = Path(__file__).resolve().parents[1]
DEMO_CONFIG = REPO / "configs" / "demo.toml"


def main() -> None:
    from rich.console import Console

    from harness.experiment.commands import execute_run, print_summary

    console = Console()
    console.print("[bold]replaybench demo[/]: paired replay on the SIMULATED engine (takes about 3 minutes)")
    try:
        root = execute_run(console, DEMO_CONFIG, None, None, False, REPO / "reports")
    except UserError as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(error.exit_code)
    print_summary(console, root)
    console.print(f"\nOpen the report: [bold]{root / 'index.html'}[/]")


if __name__ == "__main__":
    main()

"""`python -m harness ...` is `replaybench ...` (for hosts where the console script is not on PATH)."""

from harness.cli import app

app()

"""The report of a run directory (DESIGN §8): index.html, summary.json, decision.json, summary.md, junit.xml.
Entry point: `harness.report.build.build_report(run_dir) -> Decision`."""

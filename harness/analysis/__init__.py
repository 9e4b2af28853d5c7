"""Per-run metrics, paired statistics over repeats, and the KEEP / REJECT / INCONCLUSIVE / INVALID decision
(DESIGN §7). Entry point: `harness.analysis.analyse.analyse_run_dir(run_dir)`; the statistics core
(`paired_stats`, `gate_rule`) works on plain arrays so it can be tested on simulations."""

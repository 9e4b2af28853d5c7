"""Paired experiments (DESIGN §6): config, repeats, ordering, retries, quality tasks, the run directory.

    config = load_config(Path("configs/demo.toml"))        # config.py: pydantic, errors name the key
    findings = run_checks(config)                           # check.py: preflight (also run first by `run`)
    ExperimentRunner(config, run_dir).execute()             # runner.py: after rundir.freeze_config(...)

The CLI (`replaybench run`, `replaybench check`) is in `commands.py`; it alone calls the report builder.
"""

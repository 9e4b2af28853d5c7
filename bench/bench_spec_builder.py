"""Host time of a speculative step's Mamba-2 metadata (every KV-cache group's): vLLM's builder, ReplaySSM's with the
later groups derived from the first (session 26), and ReplaySSM's with a build per group (``per_group_builds``).

Why: at batch 128 a ReplaySSM spec step (~21 ms on the H200) sits near vLLM 0.24's host work, and issue 17's 1.6×
over native spec needs ~0.5-1 ms of it back. vLLM builds every Mamba group under speculation (its builder turns
``update_block_table`` off); Nemotron-H-8B has six. The builders are vLLM 0.24's own (its CPU venv), the timing
script is bench/spec_builder_host_cost.py.
"""

from __future__ import annotations

from bench.bench_builder import REPO, write_venv_rows

CONFIG = REPO / "tests" / "replayssm" / "integration" / "nemotron_h_tiny_fp32_config.json"


def main() -> None:
    notes = (
        "µs per verify step for the metadata of 6 Mamba-2 KV-cache groups (Nemotron-H-8B's count; one layer per "
        "group, the tiny Nemotron-H config's shapes: a builder's work does not grow with the state), 64 decode rows "
        "of 1 + k = 4 tokens, num_accepted random in 1..4 per row, made as vLLM 0.24's model runner makes it; "
        "median of 5 rounds of 200 steps. vLLM's real builders on the CPU: ReplaySSM's verify plan runs its "
        "PyTorch twin here, one Triton launch on a GPU, so these are this CPU's figures for comparing the "
        "builders, not the H200's. Single-threaded torch."
    )
    title = "Mamba-2 speculative metadata: host µs per step"
    write_venv_rows("bench_spec_builder", "spec_builder_host_cost.py", CONFIG, title, notes)


if __name__ == "__main__":
    main()

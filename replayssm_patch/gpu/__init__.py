"""GPU-only scripts for ReplaySSM (run on the H200 host, never in CI): see kernel_bench.py."""

"""The trace format: schema, read/write/validate/slice (`model`), importers, exporters and statistics.

Kept import-free so `replaybench --help` does not pay for pyarrow; use `harness.trace.model.Trace`.
"""

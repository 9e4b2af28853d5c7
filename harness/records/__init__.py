"""Typed records shared by every layer: the trace and result Parquet schemas (DESIGN §2).

They live below every other package so that, e.g., analysis can read results without importing replay.
"""

"""The trace format: schema, read/write/validate/slice, importers and exporters."""

from harness.trace.model import Trace

__all__ = ["Trace"]

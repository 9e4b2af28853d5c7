"""Test helpers shared by several test packages (e.g. the OpenAI-compatible test upstream)."""

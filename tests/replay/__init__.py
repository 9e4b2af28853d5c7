"""Tests of harness.replay against the real test upstream on loopback."""

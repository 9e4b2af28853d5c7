"""Fixtures for the simulated engine tests."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from tests.sim.support import SimProcess, start_sim


@pytest.fixture
def sim_server() -> Iterator[Callable[..., SimProcess]]:
    """Factory: `sim_server("--policy", "replayssm")`; every process it started is stopped at teardown."""
    started: list[SimProcess] = []

    def factory(*args: str) -> SimProcess:
        started.append(start_sim(*args))
        return started[-1]

    yield factory
    for sim in started:
        sim.stop()

"""Cost and energy per successful request, and the break-even line (monthly saving vs setup and operating cost)."""

from __future__ import annotations

import numpy as np

from harness.analysis.energy import COUNTER, POWER_SAMPLES, RunEnergy
from harness.analysis.model import CostSummary
from harness.records.decision_config import CostConfig


def _mean(values: list[float]) -> float | None:
    finite = [v for v in values if np.isfinite(v)]
    return float(np.mean(finite)) if finite else None


def _measured_mean(values: list[float]) -> float | None:
    """The mean only when every run was measured: a mean over some repeats would compare different repeats."""
    return _mean(values) if values and all(np.isfinite(values)) else None


JOULES_PER_KWH = 3.6e6


def _sources(energies: list[RunEnergy]) -> str:
    """How the runs' energy was measured (a mix is named as one)."""
    found = {e.source for e in energies if e.joules is not None}
    if len(found) > 1:
        return f"{COUNTER} in some runs, {POWER_SAMPLES} in others"
    return next(iter(found), "not measured")


def energy_line(
    baseline_j: float | None, candidate_j: float | None, energies: list[RunEnergy], cost: CostConfig
) -> str:
    """Both arms' energy per successful request, its change and, with `[cost] energy_price_per_kwh`, its price;
    else why a run's energy was not measured."""
    if baseline_j is None or candidate_j is None:
        reason = next((e.reason for e in energies if e.joules is None), "no successful request in an arm")
        return f"not measured ({reason})"
    line = (
        f"baseline {baseline_j:.3g} J, candidate {candidate_j:.3g} J "
        f"({candidate_j / baseline_j - 1:+.1%}); each arm's GPUs, {_sources(energies)}"
    )
    price = cost.energy_price_per_kwh
    if price > 0:
        line += (
            f"; at {price:g} {cost.currency}/kWh {baseline_j / JOULES_PER_KWH * price:.3g} and "
            f"{candidate_j / JOULES_PER_KWH * price:.3g} {cost.currency} per successful request"
        )
    return line


def summarise_cost(
    baseline_costs: list[float],
    candidate_costs: list[float],
    cost: CostConfig,
    energy: tuple[list[float], list[float], list[RunEnergy]],
) -> CostSummary:
    """Mean cost per successful request per arm over the valid repeats, and when the candidate pays back.

    `energy`: each arm's energy per successful request over the same repeats, and the runs' measurements (for
    the reason a figure is missing).
    """
    base, cand = _mean(baseline_costs), _mean(candidate_costs)
    base_j, cand_j = _measured_mean(energy[0]), _measured_mean(energy[1])
    saving = net = months = None
    cur = cost.currency
    if base is None or cand is None:
        line = "break-even: not computable (an arm has no successful request in the valid repeats)"
    elif cost.monthly_requests <= 0:
        line = (
            f"break-even: set [cost] monthly_requests to compare; per request the candidate "
            f"{'saves' if cand < base else 'costs'} {abs(base - cand):.3g} {cur}"
        )
    else:
        saving = (base - cand) * cost.monthly_requests
        net = saving - cost.operating_cost_per_month
        if net <= 0:
            line = (
                f"break-even: never — monthly saving {saving:,.2f} {cur} does not cover the operating cost "
                f"{cost.operating_cost_per_month:,.2f} {cur}/month"
            )
        else:
            months = cost.setup_cost / net
            line = (
                f"break-even after {months:.1f} months: saves {net:,.2f} {cur}/month net at "
                f"{cost.monthly_requests:,.0f} requests/month against {cost.setup_cost:,.2f} {cur} setup cost"
            )
    return CostSummary(
        currency=cur,
        gpu_hour_price=cost.gpu_hour_price,
        gpus_per_arm=cost.gpus_per_arm,
        baseline_cost_per_success=base,
        candidate_cost_per_success=cand,
        monthly_requests=cost.monthly_requests,
        monthly_saving=saving,
        monthly_net_saving=net,
        setup_cost=cost.setup_cost,
        operating_cost_per_month=cost.operating_cost_per_month,
        break_even_months=months,
        line=line,
        baseline_energy_per_success_j=base_j,
        candidate_energy_per_success_j=cand_j,
        energy_line=energy_line(base_j, cand_j, energy[2], cost),
    )

"""Cost per successful request and the break-even line (monthly saving vs setup and operating cost)."""

from __future__ import annotations

import numpy as np

from harness.analysis.model import CostSummary
from harness.records.decision_config import CostConfig


def _mean(values: list[float]) -> float | None:
    finite = [v for v in values if np.isfinite(v)]
    return float(np.mean(finite)) if finite else None


def summarise_cost(baseline_costs: list[float], candidate_costs: list[float], cost: CostConfig) -> CostSummary:
    """Mean cost per successful request per arm over the valid repeats, and when the candidate pays back."""
    base, cand = _mean(baseline_costs), _mean(candidate_costs)
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
    )

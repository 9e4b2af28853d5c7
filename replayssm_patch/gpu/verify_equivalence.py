"""Speculative verify equivalence on the real compiler: the kernel bench's section (d).

The decode equivalence (section (a)) drives ``replay_decode_step``; this drives ``replay_verify_step`` the way the
plugin does under MTP k = 3: the builder's cursor plan (``CursorTable.verify_step``: commit the accepted prefix of
each row's last verify, fold a history that would overflow the ring, append T tokens), paged caches in the verify
layout, a random number of accepted tokens per row and step. The truth is the fp64 Mamba-2 recurrence run from each
row's committed state, so every output of every verify (accepted or not) is checked, and at the end the fp32 master,
after folding what is still pending, against the committed fp64 state. The CPU tests do the same at toy shapes under
the interpreter (tests/replayssm/kernels/test_verify_kernels.py); this runs the Nemotron-H shapes on the GPU.
"""

from __future__ import annotations

from typing import Any

from replayssm_patch.gpu.bench_common import TARGET_REL_ERR
from replayssm_patch.gpu.mamba_bench_setup import Plan, Shape, fold_tuning_of, paged_cache, scattered_slots, tuning_of
from replayssm_patch.gpu.variants import SPEC_TOKENS
from replayssm_patch.gpu.verify_bench import VERIFY_TOKENS

STEP_SHARE = 2 * VERIFY_TOKENS  # eq_steps / this verify steps: half the decode equivalence's tokens per row (the
# fp64 truth keeps T states of the whole batch, ~9 GB at 256 rows, and costs a few seconds per 100 steps)


def run_verify_equivalence(
    plan: Plan,
    device: str,
    configs: dict[str, Shape | None] | None = None,
    fold_configs: dict[str, Shape | None] | None = None,
) -> dict[str, Any]:
    """Both precisions over ``plan.eq_steps // STEP_SHARE`` verify steps at ``plan.eq_batch`` rows, the same tokens
    and acceptances in each: worst output error per step (max |diff| over max |truth|) and the master's error after
    the final fold. fp32 must stay within the decode equivalence's target. ``configs`` / ``fold_configs``: each
    mode's verify and fold launch shapes (the verify section's sweep winners, which the launch table then holds),
    else the table's."""
    import torch

    from replayssm_patch.cursors import NULL_BLOCK_ID, CursorTable
    from replayssm_patch.kernels import flush_ring
    from replayssm_patch.kernels.synthetic import LayerParams

    T, batch = VERIFY_TOKENS, plan.eq_batch
    steps = max(plan.eq_steps // STEP_SHARE, 2)
    gen = torch.Generator(device).manual_seed(4321)
    layer = LayerParams.random(plan.nheads, gen, device)
    pool = batch + 8
    indices = scattered_slots(pool, batch, gen)
    h0 = torch.randn(batch, plan.nheads, plan.head_dim, plan.d_state, generator=gen, device=device)
    result: dict[str, Any] = {"batch": batch, "steps": steps, "tokens_per_row": T, "target": TARGET_REL_ERR}
    for mode, split in (("fp32", False), ("split", True)):
        tuning = tuning_of((configs or {}).get(mode))
        fold = fold_tuning_of((fold_configs or {}).get(mode))
        cache = paged_cache(plan, pool, split, device, SPEC_TOKENS)
        cache.set_checkpoint(indices, h0)
        table = CursorTable(pool, plan.buffer_len, device, stagger=True, verify_len=T)
        tokens = torch.Generator(device).manual_seed(99)  # the same tokens and acceptances in both modes
        truth, accepted = h0.double(), torch.ones(batch, dtype=torch.int32, device=device)
        errors, folds = [], 0
        for step in range(steps):
            verify = _verify_once(plan, layer, cache, table, indices, accepted, tokens, NULL_BLOCK_ID,
                                  {**tuning, "fold_launch": fold})  # fmt: skip
            folds += verify["folds"]
            y_true, states = _truth(truth, verify["inputs"], layer, batch)
            errors.append(float((verify["out"].double() - y_true).abs().max() / y_true.abs().max()))
            accepted = torch.randint(1, T + 1, (batch,), generator=tokens, device=device, dtype=torch.int32)
            truth = states[accepted.long() - 1, torch.arange(batch, device=device)]  # after the accepted tokens
            if step % 100 == 0 or step == steps - 1:
                print(f"[kernel_bench]   verify {mode} step {step + 1}/{steps}", flush=True)
        pending = table.take_pending(indices, torch.ones(batch, dtype=torch.bool, device=device), accepted)
        flush_ring(cache.ssm_state, cache.ring_x, cache.ring_B, cache.ring_dt, layer.A, indices, pending,
                   state_bf16=cache.state_bf16, **fold)  # fmt: skip
        master = cache.ssm_state[indices.long()].double()
        result[mode] = {
            "max_rel_err": max(errors),
            "final_state_rel_err": float((master - truth).abs().max() / truth.abs().max()),
            "finite": bool(torch.isfinite(master).all()),
            "rows_folded": folds,
            "launch": {**tuning, "fold": fold} if tuning or fold else "launch table",
        }
    result["ok"] = result["fp32"]["finite"] and result["fp32"]["max_rel_err"] <= TARGET_REL_ERR
    return result


def _verify_once(
    plan: Plan, layer: Any, cache: Any, table: Any, indices: Any, accepted: Any, gen: Any, pad_slot_id: int,
    tuning: dict[str, Any],
) -> dict[str, Any]:  # fmt: skip
    """One verify step of every row: the cursor plan (with its list of folding rows, as the plugin's), then
    ``replay_verify_step`` on fresh bf16 tokens."""
    import torch

    from replayssm_patch.kernels import replay_verify_step
    from replayssm_patch.kernels.synthetic import StepInputs

    batch, T, device = indices.shape[0], VERIFY_TOKENS, indices.device
    qsl = torch.arange(0, batch * T + 1, T, dtype=torch.int32, device=device)
    write_pos, fold_len, fold_rows = torch.empty(3, batch, dtype=torch.int32, device=device)
    fold_count = torch.empty(1, dtype=torch.int32, device=device)
    table.verify_step(indices, qsl, accepted, write_pos, fold_len, fold_rows=fold_rows, fold_count=fold_count)
    inputs = StepInputs.random(batch * T, plan.nheads, plan.head_dim, plan.ngroups, plan.d_state, layer, gen,
                               torch.bfloat16)  # fmt: skip
    out = torch.empty(batch * T, plan.nheads, plan.head_dim, device=device)
    replay_verify_step(
        inputs.x, inputs.dt, layer.A, inputs.B, inputs.C, cache.ssm_state, cache.ring_x, cache.ring_B, cache.ring_dt,
        indices, write_pos, fold_len, qsl, T, state_bf16=cache.state_bf16, D=layer.D, dt_bias=layer.dt_bias,
        pad_slot_id=pad_slot_id, out=out, fold_list=(fold_rows, fold_count), **tuning,
    )  # fmt: skip
    return {"inputs": inputs, "out": out, "folds": int((fold_len > 0).sum())}


def _truth(h: Any, inputs: Any, layer: Any, batch: int) -> tuple[Any, Any]:
    """fp64 outputs [batch * T, H, P] of T recurrence steps from the committed states h (not modified), and the
    state after each token [T, batch, H, P, N]."""
    import torch

    from replayssm_patch.kernels.ground_truth import recurrence_step_fp64

    h, outputs, states = h.clone(), [], []
    for j in range(VERIFY_TOKENS):
        token = inputs.rows(torch.arange(batch, device=h.device) * VERIFY_TOKENS + j)
        outputs.append(recurrence_step_fp64(h, token.x, token.dt, layer.A, token.B, token.C, D=layer.D,
                                            dt_bias=layer.dt_bias))  # fmt: skip
        states.append(h.clone())
    return torch.stack(outputs, dim=1).flatten(0, 1), torch.stack(states)


def verify_equivalence_markdown(section: dict[str, Any]) -> list[str]:
    """The section's Markdown body (``kernel_bench.render_markdown`` puts it under its heading)."""
    lines = [
        f"{section['steps']} verify steps of T = {section['tokens_per_row']} tokens at batch {section['batch']}, "
        "through the builder's cursor plan, a random number of tokens accepted per row and step, against the fp64 "
        f"recurrence from each row's committed state (target for fp32: {section['target']:.0e}).",
        "",
        "| mode | worst output error | master after the final fold | rows folded | finite | verify launch |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for mode in ("fp32", "split"):
        m = section[mode]
        lines.append(f"| {mode} | {m['max_rel_err']:.2e} | {m['final_state_rel_err']:.2e} | {m['rows_folded']} | "
                     f"{m['finite']} | {m.get('launch', 'launch table')} |")  # fmt: skip
    return [*lines, "", f"fp32 within the target: {section['ok']}.", ""]

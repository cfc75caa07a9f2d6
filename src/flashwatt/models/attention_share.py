"""The attention's share of a model step, measured in marked steps of their own (the
markers cost a few microseconds a call: flashwatt.models.attention_timer), for the one-GPU
and the multi-GPU model jobs."""
from __future__ import annotations

from flashwatt.models.cell import ModelCell


def attention_share(step, model, cell: ModelCell, device, count: int) -> dict:
    """Attention milliseconds per step (forward, backward) and their share of the step,
    in steps with markers (flashwatt.models.attention_timer)."""
    from flashwatt.models.attention_timer import AttentionTimer
    from flashwatt.models.step import StepClock

    method = "CUDA events around every attention call (hooks), forward and backward, in marked steps"
    if device.type != "cuda":
        return {"method": None, "reason": "timed on CUDA devices only"}
    if cell.compiled:
        return {"method": None, "reason": "not measured under torch.compile (the markers would break its graph)"}
    if count <= 0:
        return {"method": None, "reason": "attention_steps is 0"}
    timer = AttentionTimer()
    timer.attach(model)
    try:
        step.run()  # warm the marked path
        timer.take()
        clock = StepClock(device)
        shares, forward, backward, totals = [], [], [], []
        for _ in range(count):
            spans = step.timed(clock)
            attn = timer.take()
            forward.append(attn["forward"])
            backward.append(attn["backward"])
            totals.append(spans["step"])
            shares.append((attn["forward"] + attn["backward"]) / spans["step"])
    finally:
        timer.detach(model)
    import statistics

    return {"method": method, "forward_ms": statistics.median(forward), "backward_ms": statistics.median(backward),
            "marked_step_ms": statistics.median(totals), "share": statistics.median(shares),
            "calls_per_step": timer.calls // (count + 1)}

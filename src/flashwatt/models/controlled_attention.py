"""The power-aware controller as a model's attention: every attention call of the model goes
to `Controller.attention`, which runs it in the configuration it picks for that call's shape
(backend, our kernel's tile or CTA cap; flashwatt.control).

A model cell with backend `control_energy` or `control_<W>w` runs through this:
1. `settle`: steps until the controller has tried its candidates for every shape the model
   calls and its choice has held for a while (or `settle_s` passed), so what is timed
   afterwards is the controller's steady state; the settling's seconds are recorded;
2. the cell's timed steps, attention steps and energy window, as for any backend;
3. `check_configurations`: the model check (flashwatt.models.check) through each
   configuration that ran in step 2, pinned with a static controller.

The inputs are what a registry kernel takes (flashwatt.models.attention.registry_inputs):
grouped-query K/V go un-expanded, and a configuration that refuses a call is dropped by
the controller for that shape, with its reason kept (`Controller.refusals`).
"""
from __future__ import annotations

import time

from flashwatt.models.attention import register, registry_inputs, unpadded_mask

# Settled: the choices held this long with nothing exploring; twice the governor's dwell
# (flashwatt.control.governor), the least time it keeps a choice before it may switch.
DEFAULT_HOLD_S = 6.0
# One registered name per controller object: transformers looks the function up by name.
_NAME = "fw_control_{}"


class ControlledAttention:
    """A Controller as a transformers attention function."""

    def __init__(self, controller):
        self.controller = controller

    def __call__(self, module, query, key, value, attention_mask, scaling: float | None = None, dropout: float = 0.0,
                 is_causal: bool | None = None, **kwargs):
        query, key, value, causal = registry_inputs("the controller", module, query, key, value, attention_mask,
                                                    scaling, dropout, is_causal)
        out = self.controller.attention(query, key, value, causal=causal)
        return out.transpose(1, 2), None


def use_controller(model, controller) -> ControlledAttention:
    """Switch `model`'s attention to `controller`; the adapter it runs."""
    adapter = ControlledAttention(controller)
    model.set_attn_implementation(register(_NAME.format(id(controller)), adapter, unpadded_mask()))
    return adapter


def open_controller(mode: str, budget_w: float | None, device, telemetry):
    """The cell's controller, reading the job's own NVML handle (no second one)."""
    from flashwatt.control import Controller

    return Controller(mode=mode, budget_w=budget_w, device=device, telemetry=telemetry)


def settle(step, controller, sync, settle_s: float, hold_s: float = DEFAULT_HOLD_S, min_steps: int = 3) -> dict:
    """Run steps until the controller's choices have held, with no shape exploring, for
    `hold_s` seconds and `min_steps` steps; or until `settle_s` seconds have passed.
    Returns what it took. (The governor may still switch later for a predicted gain; the
    cell records every configuration that ran while measured.)"""
    t0 = time.perf_counter()
    steps, steady, held_from, choices = 0, 0, t0, None
    while True:
        explored = controller.exploring  # a step counts as steady when it began and ended so
        step.run()
        sync()
        steps += 1
        now = time.perf_counter()
        if explored or controller.exploring or controller.choices() != choices:
            steady, held_from, choices = 0, now, controller.choices()
        else:
            steady += 1
        settled = steady >= min_steps and now - held_from >= hold_s
        if settled or now - t0 >= settle_s:
            break
    return {"seconds": now - t0, "steps": steps, "settled": settled, "limit_s": settle_s, "hold_s": hold_s,
            "choices": controller.choices(), "calls": controller.call_counts()}


def calls_between(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    """Calls per configuration label made between two `call_counts()` snapshots."""
    return {label: n - before.get(label, 0) for label, n in after.items() if n > before.get(label, 0)}


def check_configurations(model, labels, device, check) -> dict:
    """`check(model)` with the model's attention pinned to each configuration in turn (a
    static controller, no telemetry); the adapter in place before is restored after."""
    from flashwatt.control import Controller

    previous = model.config._attn_implementation
    results = {}
    try:
        for label in labels:
            pinned = Controller(mode="static", configuration=label, device=device)
            use_controller(model, pinned)
            results[label] = check(model)
    finally:
        model.set_attn_implementation(previous)
    return results

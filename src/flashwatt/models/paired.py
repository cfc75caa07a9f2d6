"""A model cell's backend and the SDPA default timed in one process, on one GPU, in
alternating rounds: the comparison that holds when the two differ by less than GPUs do.

Cells of a suite land on different GPUs, and on one GPU minutes apart. A prefill step
holds an H100 at its power limit and runs at whatever clock that limit leaves, which is
not the same on two GPUs of one model: the one-GPU models suite, spread over three H100s,
measured the same kernels 1-10% apart (docs/models.md), more than attention's 7-20% of a
step lets a backend gain or lose. Comparing two cells' tokens per second then compares
GPUs as much as backends.

With `steps.paired_rounds: N`, a one-GPU cell whose backend is not the default, not
compiled and not the controller runs N rounds after its own measurement, on the same model,
weights and tokens: each round switches the model to the cell's backend and to
`sdpa_default`, in the order ABBA..., and for each times `timed_steps` steps (CUDA events,
median) and, where NVML reads the GPU, the energy of a window of whole steps of at least
the suite's `energy_window_s` (no idle window: only the ratio is asked for). `speed` is the
median over rounds of default step time / backend step time, `energy` the median of
backend joules per token / default joules per token; every round is kept. Running out of
memory in a round ends the rounds with the reason; the cell's own measurement stands.
"""
from __future__ import annotations

import statistics
from typing import Callable

REFERENCE = "sdpa_default"


def why_unpaired(cell) -> str | None:
    """Why a cell takes no paired rounds, or None."""
    if cell.gpus > 1:
        return "paired rounds run on one GPU"
    if cell.backend == REFERENCE:
        return f"the cell is the reference ({REFERENCE})"
    if cell.compiled:
        return "a compiled cell is not paired (switching its attention would recompile the graph)"
    if cell.control is not None:
        return "a controller cell is not paired (it changes its configuration as it runs)"
    return None


def round_order(backend: str, r: int) -> tuple[str, str]:
    """ABBA: the backend first in rounds 0, 3, 4, 7, ..., so neither is always timed
    first after a switch, nor always on the warmer GPU."""
    first = (r % 4) in (0, 3)
    return (backend, REFERENCE) if first else (REFERENCE, backend)


def paired_rounds(cell, step, device, telemetry, settings, rounds: int, steps_per_round: int,
                  switch: Callable[[str], None], implementation: Callable[[], str]) -> dict:
    """Run the rounds; `switch(backend)` puts the model on a backend, `implementation()`
    names the attention the model runs now (written beside each timing, so a round that
    did not switch shows it). Leaves the model on the cell's backend."""
    import torch

    from flashwatt import measure
    from flashwatt.energy import measure_energy
    from flashwatt.models.step import time_steps

    cuda = device.type == "cuda"

    def sync():
        if cuda:
            torch.cuda.synchronize(device)

    energy = bool(telemetry is not None and telemetry.available)
    out: dict = {"reference": REFERENCE, "steps_per_round": steps_per_round,
                 "method": "alternating rounds (ABBA) in one process on one GPU: each round times "
                           f"{steps_per_round} steps of each (CUDA events, median)"
                           + (" and an NVML energy window of whole steps of each" if energy else ""),
                 "rounds": []}
    if not energy:
        out["energy_reason"] = getattr(telemetry, "reason", None) or "no telemetry"
    try:
        for r in range(rounds):
            entry: dict = {"order": list(round_order(cell.backend, r)), "step_ms": {}, "implementation": {},
                           "j_per_token": {}}
            for name in entry["order"]:
                switch(name)
                step.run()  # the first step after a switch builds what the backend caches
                sync()
                entry["implementation"][name] = implementation()
                entry["step_ms"][name] = time_steps(step, device, steps_per_round)["step_ms"]
                if energy:
                    window = measure_energy(step.run, sync, telemetry, **settings.energy_window(idle=False))
                    per_call = window.energy_per_call_j
                    entry["j_per_token"][name] = per_call / cell.tokens if per_call is not None else None
            out["rounds"].append(entry)
    except Exception as err:  # noqa: BLE001 - only running out of memory is an outcome here
        if not measure.is_oom(err):
            raise
        out["reason"] = f"out of memory in round {len(out['rounds'])}: {str(err).splitlines()[0]}"
        if cuda:
            torch.cuda.empty_cache()
    finally:
        switch(cell.backend)
    out.update(_ratios(out["rounds"], cell.backend))
    return out


def _ratios(rounds: list[dict], backend: str) -> dict:
    speed = [r["step_ms"][REFERENCE] / r["step_ms"][backend] for r in rounds]
    energy = [r["j_per_token"][backend] / r["j_per_token"][REFERENCE] for r in rounds
              if r["j_per_token"].get(backend) and r["j_per_token"].get(REFERENCE)]
    return {"speed": statistics.median(speed) if speed else None,
            "speed_range": [min(speed), max(speed)] if speed else None,
            "energy": statistics.median(energy) if energy else None,
            "energy_range": [min(energy), max(energy)] if energy else None}

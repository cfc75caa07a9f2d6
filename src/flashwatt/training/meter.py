"""A training run's clocks and energy: seconds in training steps, in evaluations and in
checkpoints, and the NVML energy counter since the run started, carried over a resume.

Energy is the counter's delta from the run's start, read at every evaluation, so a loss
curve against joules is exact to within what the counter has not yet added when it is
read (it updates every ~100 ms: at most one update of energy at each reading, never
accumulating along the run). The start edge is placed on a counter update: the GPU is
idle there, so the run waits (at most a quarter second) for the counter to move and
counts from that moment. Evaluations and checkpoints run inside the same window: the
energy and wall time to a target are what the run cost, evaluation included, and the
seconds of each part are recorded beside them (`eval_s`, `checkpoint_s`) so its share is
seen. A resumed run starts from the totals saved in its checkpoint: the steps redone
after the checkpoint are counted once, in the job that finished them.
"""
from __future__ import annotations

import contextlib
import time
from typing import Callable

from flashwatt.energy import await_ticks
from flashwatt.telemetry import Sampler, Telemetry

PARTS = ("train", "eval", "checkpoint")
_EDGE_TIMEOUT_S = 0.25


class RunMeter:
    def __init__(self, telemetry: Telemetry, sync: Callable[[], None], carried: dict | None = None,
                 sampler_period_s: float = 0.1):
        carried = carried or {}
        self.telemetry, self.sync = telemetry, sync
        self.seconds = {part: float(carried.get(f"{part}_s", 0.0)) for part in PARTS}
        self._wall0 = float(carried.get("wall_s", 0.0))
        self._energy0 = carried.get("energy_j", 0.0)
        self.peak_power_w = carried.get("peak_power_w")
        self._counter0 = None
        if telemetry.available:
            sync()
            self._counter0 = await_ticks(telemetry, time.perf_counter, _EDGE_TIMEOUT_S)[0].counter_mj
        self._t0 = time.perf_counter()
        self._sampler = Sampler(telemetry, sampler_period_s).start() if telemetry.available else None

    @property
    def has_energy(self) -> bool:
        return self._counter0 is not None and self._energy0 is not None

    def energy_j(self) -> float | None:
        """Joules since the run began (over every job of it); None without a counter, or
        when the counter went backwards (a reset: no longer trustworthy)."""
        if not self.has_energy:
            return None
        now = self.telemetry.energy_mj()[0]
        if now is None or now < self._counter0:
            return None
        return self._energy0 + (now - self._counter0) / 1000.0

    def wall_s(self) -> float:
        return self._wall0 + time.perf_counter() - self._t0

    @contextlib.contextmanager
    def part(self, name: str):
        """Time one part (train, eval, checkpoint) between two synchronisations."""
        self.sync()
        t = time.perf_counter()
        try:
            yield
        finally:
            self.sync()
            self.seconds[name] += time.perf_counter() - t

    def totals(self) -> dict:
        """The run's totals now: what a checkpoint carries and a curve row holds."""
        out = {f"{part}_s": self.seconds[part] for part in PARTS}
        out["wall_s"] = self.wall_s()
        out["energy_j"] = self.energy_j()
        out["peak_power_w"] = self._peak()
        return out

    def _peak(self) -> float | None:
        if self._sampler is None:
            return self.peak_power_w
        powers = [r["power_instant_w"] for r in list(self._sampler.rows) if r.get("power_instant_w") is not None]
        known = [p for p in (self.peak_power_w, max(powers, default=None)) if p is not None]
        return max(known) if known else None

    def close(self) -> dict:
        """Stop the power sampler; the totals."""
        totals = self.totals()
        if self._sampler is not None:
            self._sampler.stop()
            totals["peak_power_w"] = self._peak()
            self._sampler = None
        return totals

"""A simulated GPU for the control logic's tests: power as a first-order lag toward what the
running configuration draws at its duty, NVML-like sensor updates every 0.1 s, noise, a cap
that clips, and an optional disturbance (another tenant's watts).

The governor under test is the real one; only the GPU and the clock are simulated, in
simulated time, so a 20 s scenario takes milliseconds and is the same every run.
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field

import pandas as pd

from flashwatt.control.configuration import Configuration
from flashwatt.control.governor import Governor, Reading, Work

SHAPE = ((4, 16, 4096, 128), (4, 16, 4096, 128), False, "bf16")
TOKENS_PER_CALL = 4 * 4096


@dataclass
class Profile:
    """What one configuration does on the simulated board."""

    tokens_per_s: float  # at full duty
    power_full_w: float  # drawn at full duty, before the cap


CUDNN = Configuration("sdpa_cudnn")
CUSTOM = Configuration("custom")
CTAS33 = Configuration("custom", "ctas33")
FLASH = Configuration("sdpa_flash")
# Shaped after the H100 at B4 H16 L4096 D128 bf16 (docs/measurement.md): cuDNN fastest at
# the cap, our kernel next, a CTA cap drawing less at a much lower throughput.
PROFILES = {
    CUSTOM: Profile(tokens_per_s=13.6e6, power_full_w=760),
    CTAS33: Profile(tokens_per_s=4.8e6, power_full_w=500),
    CUDNN: Profile(tokens_per_s=17.0e6, power_full_w=690),
    FLASH: Profile(tokens_per_s=9.8e6, power_full_w=760),
}

@dataclass
class Plant:
    profiles: dict[Configuration, Profile]
    idle_w: float = 120.0
    cap_w: float = 700.0
    lag_s: float = 0.05  # the board's power settles with this time constant
    noise_w: float = 6.0
    sensor_period_s: float = 0.1
    dt: float = 0.01
    curve: float = 0.75  # power above idle grows as duty ** curve (concave, as measured)
    disturbance: list[tuple[float, float]] = field(default_factory=list)  # (from t, extra W)
    burst_w: float = 0.0  # a bursty tenant: each 0.3 s its watts move by up to this much
    telemetry_dead_after: float | None = None
    seed: int = 0

    def _extra_w(self, t: float) -> float:
        extra = sum(w for start, w in self.disturbance if t >= start)
        if self.burst_w and extra:
            extra += random.Random(self.seed * 100003 + int(t / 0.3)).uniform(-1.0, 1.0) * self.burst_w
        return extra

    def target_w(self, config: Configuration, duty: float, t: float) -> float:
        prof = self.profiles[config]
        extra = self._extra_w(t)
        return min(self.cap_w, self.idle_w + (prof.power_full_w - self.idle_w) * duty ** self.curve + extra)

    def throughput(self, config: Configuration, duty: float, t: float) -> float:
        prof = self.profiles[config]
        drawn = self.idle_w + (prof.power_full_w - self.idle_w) * duty ** self.curve
        extra = self._extra_w(t)
        if drawn + extra > self.cap_w:  # at the cap the board slows down to fit
            room = max(0.0, self.cap_w - extra - self.idle_w)
            return prof.tokens_per_s * duty * room / (drawn - self.idle_w)
        return prof.tokens_per_s * duty


def run(governor: Governor, plant: Plant, seconds: float, budget_schedule: list[tuple[float, float]] = (),
        shape: tuple = SHAPE) -> pd.DataFrame:
    """Drive the governor for `seconds` of simulated time; its trace, with the true power."""
    rng = random.Random(plant.seed)
    clock = {"t": 0.0}
    governor.clock = lambda: clock["t"]
    power = plant.idle_w
    energy_j = 0.0
    sensed = power
    next_sensor = 0.0
    next_tick = plant.sensor_period_s
    schedule = sorted(budget_schedule)
    work = Work()
    rows = []
    carry_tokens = 0.0
    while clock["t"] < seconds:
        t = clock["t"]
        while schedule and schedule[0][0] <= t:
            governor.set_budget(schedule.pop(0)[1])
        config = governor.config_for(shape)
        duty = governor.duty
        # latency samples as the controller's CUDA events would give them
        prof = plant.profiles[config]
        governor.on_latency(shape, config, TOKENS_PER_CALL / prof.tokens_per_s, TOKENS_PER_CALL)
        carry_tokens += plant.throughput(config, duty, t) * plant.dt
        while carry_tokens >= TOKENS_PER_CALL:
            work.add(shape, config, TOKENS_PER_CALL)
            carry_tokens -= TOKENS_PER_CALL
        target = plant.target_w(config, duty, t)
        power += (target - power) * min(1.0, plant.dt / plant.lag_s)
        energy_j += power * plant.dt
        if t >= next_sensor:  # NVML's own update period: readings hold between updates
            sensed = power + rng.gauss(0.0, plant.noise_w)
            next_sensor += plant.sensor_period_s
        clock["t"] = t + plant.dt
        if clock["t"] >= next_tick:
            next_tick += plant.sensor_period_s
            dead = plant.telemetry_dead_after is not None and clock["t"] >= plant.telemetry_dead_after
            reading = Reading(clock["t"], None if dead else sensed, None if dead else energy_j * 1e3,
                              error="NVMLError_Unknown: simulated sensor failure" if dead else None)
            row = governor.tick(reading, work)
            row["true_power_w"] = power
            row["true_energy_mj"] = energy_j * 1e3
            rows.append(row)
            work = Work()
    return pd.DataFrame(rows)

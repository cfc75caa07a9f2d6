"""A simulated GPU for the control logic's tests: power as a first-order lag toward what the
running configuration draws at its duty, NVML-like sensor updates every 0.1 s, noise, a cap
that clips, a first-order thermal model (the temperature relaxes toward ambient + c x power
with a time constant of tens of seconds, read in whole degrees), and what a shared node
adds: other tenants' watts (and the GPU time they take), NVML read failures, a shape mix
that changes, a budget that steps and ramps.

Model steps (`SimStepGpu`, `sim_controller`, `run_steps`): the real Controller drives a
simulated board whose clock, sleep and sensor ticks are the board's, so its pacer's sleeps
idle the board and a step's blocks compute on it, all in simulated time.

The governor under test is the real one; only the GPU and the clock are simulated, in
simulated time, so a 20 s scenario takes milliseconds and is the same every run.
`simulate(scenario)` runs a generated scenario (flashwatt.control.scenario_generator) and
returns its trace with the facts the figures of merit need, and `oracle_rows` the static
rows (every configuration at a grid of duties) a run is judged against, as the oracle job
measures them on a GPU.
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field

import pandas as pd

from flashwatt.control.budget_schedule import BudgetSchedule
from flashwatt.control.configuration import Configuration
from flashwatt.control.governor import Governor, Reading, Work
from flashwatt.control.scenario_merit import ScenarioFacts

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


@dataclass(frozen=True)
class SimWorkload:
    """The shapes of successive calls, each with what every configuration does on it; several
    shapes are mixed call by call."""

    name: str
    shapes: tuple  # ((shape, {config: Profile}), ...)


def _stream_shapes() -> tuple:
    # Three shapes of the seed's mix (H8 D64): our kernel fastest on the short one, cuDNN on
    # the long ones, as on the H100.
    short = ((64, 8, 512, 64), (64, 8, 512, 64), False, "bf16")
    mid = ((32, 8, 1024, 64), (32, 8, 1024, 64), False, "bf16")
    long = ((32, 8, 2048, 64), (32, 8, 2048, 64), False, "bf16")
    return (
        (short, {CUSTOM: Profile(30e6, 620), CTAS33: Profile(9e6, 450), CUDNN: Profile(24e6, 600),
                 FLASH: Profile(20e6, 640)}),
        (mid, {CUSTOM: Profile(22e6, 680), CTAS33: Profile(7e6, 470), CUDNN: Profile(23e6, 650),
               FLASH: Profile(15e6, 700)}),
        (long, {CUSTOM: Profile(15e6, 720), CTAS33: Profile(5e6, 480), CUDNN: Profile(19e6, 680),
                FLASH: Profile(11e6, 740)}),
    )


STEADY = SimWorkload("steady", ((SHAPE, PROFILES),))
STREAM = SimWorkload("stream", _stream_shapes())
SIM_WORKLOADS = {"steady": STEADY, "stream": STREAM}


@dataclass(frozen=True)
class SimTenant:
    """Another process on the board: its watts above idle, and the share of GPU time it takes
    from ours while it runs (the GPU time-slices between processes)."""

    start: float
    seconds: float
    watts: float
    share: float = 0.0

    def active(self, t: float) -> bool:
        return self.start <= t < self.start + self.seconds


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
    tenants: list[SimTenant] = field(default_factory=list)
    telemetry_dead_after: float | None = None
    telemetry_dead: list[tuple[float, float]] = field(default_factory=list)  # (from t, to t): reads fail
    seed: int = 0
    # First-order thermal model: the temperature relaxes toward ambient + c_per_w x power with
    # a time constant of tens of seconds; NVML reads it in whole degrees.
    ambient_c: float = 30.0
    c_per_w: float = 0.08
    thermal_tau_s: float = 30.0
    start_temp_c: float | None = None  # None: the idle board's steady temperature
    temp_noise_c: float = 0.3

    def steady_temp_c(self, watts: float) -> float:
        return self.ambient_c + self.c_per_w * watts

    def holding_w(self, limit_c: float) -> float:
        """The power at which the board's temperature settles at `limit_c`."""
        return (limit_c - self.ambient_c) / self.c_per_w

    def idle_cooling_s(self, from_c: float, to_c: float) -> float:
        """Seconds the board takes to cool from `from_c` to `to_c` at idle: the fastest any
        workload's side can cool it."""
        import math

        floor = self.steady_temp_c(self.idle_w)
        return self.thermal_tau_s * math.log((from_c - floor) / (to_c - floor)) if to_c > floor else math.inf

    def _extra_w(self, t: float) -> float:
        extra = sum(w for start, w in self.disturbance if t >= start)
        if self.burst_w and extra:
            extra += random.Random(self.seed * 100003 + int(t / 0.3)).uniform(-1.0, 1.0) * self.burst_w
        return extra + sum(tenant.watts for tenant in self.tenants if tenant.active(t))

    def _share(self, t: float) -> float:
        return min(0.9, sum(tenant.share for tenant in self.tenants if tenant.active(t)))

    def _ours_w(self, prof: Profile, busy: float) -> float:
        return (prof.power_full_w - self.idle_w) * busy ** self.curve

    def target_w(self, config: Configuration, duty: float, t: float, profiles: dict | None = None) -> float:
        prof = (profiles or self.profiles)[config]
        busy = duty * (1 - self._share(t))  # the time it takes from us is time we do not draw
        return min(self.cap_w, self.idle_w + self._ours_w(prof, busy) + self._extra_w(t))

    def throughput(self, config: Configuration, duty: float, t: float, profiles: dict | None = None) -> float:
        prof = (profiles or self.profiles)[config]
        busy = duty * (1 - self._share(t))
        drawn = self.idle_w + self._ours_w(prof, busy)
        extra = self._extra_w(t)
        if drawn + extra > self.cap_w:  # at the cap the board slows down to fit
            room = max(0.0, self.cap_w - extra - self.idle_w)
            return prof.tokens_per_s * busy * room / (drawn - self.idle_w)
        return prof.tokens_per_s * busy

    def dead(self, t: float) -> bool:
        if self.telemetry_dead_after is not None and t >= self.telemetry_dead_after:
            return True
        return any(start <= t < end for start, end in self.telemetry_dead)


def _budget_timeline(budget_schedule) -> list[tuple[float, float]]:
    if isinstance(budget_schedule, BudgetSchedule):
        return budget_schedule.timeline(0.1)
    return sorted(budget_schedule)


def run(governor: Governor, plant: Plant, seconds: float, budget_schedule=(), shape: tuple = SHAPE,
        workloads: list[tuple[float, SimWorkload]] | None = None) -> pd.DataFrame:
    """Drive the governor for `seconds` of simulated time; its trace, with the true power.
    `workloads`: (from t, workload) to change the shape mix mid-run (default: `shape` alone
    with the plant's profiles)."""
    rng = random.Random(plant.seed)
    mix = random.Random(plant.seed + 1)
    heat = random.Random(plant.seed + 2)  # the temperature's noise: apart, so the power's draws stay as they were
    clock = {"t": 0.0}
    governor.clock = lambda: clock["t"]
    power = plant.idle_w
    temp = plant.start_temp_c if plant.start_temp_c is not None else plant.steady_temp_c(plant.idle_w)
    energy_j = 0.0
    sensed = power
    sensed_temp = round(temp)
    next_sensor = 0.0
    next_tick = plant.sensor_period_s
    schedule = _budget_timeline(budget_schedule)
    phases = list(workloads) if workloads else [(0.0, SimWorkload("given", ((shape, plant.profiles),)))]
    work = Work()
    rows = []
    carry: dict = {}
    while clock["t"] < seconds:
        t = clock["t"]
        while schedule and schedule[0][0] <= t:
            governor.set_budget(schedule.pop(0)[1])
        workload = [w for start, w in phases if start <= t][-1]
        call_shape, profiles = workload.shapes[mix.randrange(len(workload.shapes))]
        config = governor.config_for(call_shape)
        duty = governor.duty
        # latency samples as the controller's CUDA events would give them (slower while
        # another process takes part of the GPU's time)
        prof = profiles[config]
        seconds_per_call = TOKENS_PER_CALL / prof.tokens_per_s / (1 - plant._share(t))
        governor.on_latency(call_shape, config, seconds_per_call, TOKENS_PER_CALL)
        key = (call_shape, config)
        carry[key] = carry.get(key, 0.0) + plant.throughput(config, duty, t, profiles) * plant.dt
        while carry[key] >= TOKENS_PER_CALL:
            work.add(call_shape, config, TOKENS_PER_CALL)
            carry[key] -= TOKENS_PER_CALL
        target = plant.target_w(config, duty, t, profiles)
        power += (target - power) * min(1.0, plant.dt / plant.lag_s)
        temp += (plant.steady_temp_c(power) - temp) * plant.dt / plant.thermal_tau_s
        energy_j += power * plant.dt
        if t >= next_sensor:  # NVML's own update period: readings hold between updates
            sensed = power + rng.gauss(0.0, plant.noise_w)
            sensed_temp = round(temp + heat.gauss(0.0, plant.temp_noise_c))  # whole degrees
            next_sensor += plant.sensor_period_s
        clock["t"] = t + plant.dt
        if clock["t"] >= next_tick:
            next_tick += plant.sensor_period_s
            dead = plant.dead(clock["t"])
            reading = Reading(clock["t"], None if dead else sensed, None if dead else energy_j * 1e3,
                              temp_c=None if dead else sensed_temp,
                              error="NVMLError_Unknown: simulated sensor failure" if dead else None)
            row = governor.tick(reading, work)
            row["true_power_w"] = power
            row["true_temp_c"] = temp
            row["true_energy_mj"] = energy_j * 1e3
            row["workload"] = workload.name
            rows.append(row)
            work = Work()
    return pd.DataFrame(rows)


# ---- generated scenarios on the simulated GPU ---------------------------------------------
# A tenant's watts above idle at full intensity, and the share of GPU time it takes from us
# at full intensity (an assumption of the simulation: processes time-slice the GPU).
TENANT_WATTS = {"gemm": 560.0, "copy": 300.0}
TENANT_SHARE = 0.5


def sim_tenant(tenant: dict, plant: Plant) -> SimTenant:
    watts = TENANT_WATTS[tenant["kind"]] * tenant["intensity"] ** plant.curve
    return SimTenant(tenant["start_s"], tenant["seconds"], watts, TENANT_SHARE * tenant["intensity"])


def oracle_rows(plant: Plant, workload: SimWorkload, duties=(1.0, 0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2, 0.1)) -> list[dict]:
    """Every configuration at each duty, alone on the board: the oracle's rows. A workload of
    several shapes mixes them as `run` does, an equal share of the time each."""
    rows = []
    bare = Plant(plant.profiles, idle_w=plant.idle_w, cap_w=plant.cap_w, curve=plant.curve)
    for config in workload.shapes[0][1]:
        for duty in duties:
            tokens = sum(bare.throughput(config, duty, 0.0, p) for _, p in workload.shapes) / len(workload.shapes)
            power = sum(bare.target_w(config, duty, 0.0, p) for _, p in workload.shapes) / len(workload.shapes)
            rows.append({"config": config.label, "duty": duty, "tokens_per_s": tokens, "avg_power_w": power,
                         "j_per_token": power / tokens, "check_passed": True, "check_rel_err": 1e-3})
    return rows


def simulate(scenario: dict, governor: Governor, workload: str = "steady", plant: Plant | None = None):
    """Run a generated scenario's budget schedule, tenants, NVML failures and mix change on
    the simulated GPU. Returns (trace with the counter in `energy_mj` and the board's in
    `board_energy_mj`, ScenarioFacts with the tenants' watts alone)."""
    plant = plant or Plant(PROFILES)
    plant.tenants = [sim_tenant(t, plant) for t in scenario["tenants"]]
    plant.telemetry_dead = [(s, s + d) for s, d in scenario["nvml_failures"]]
    phases = [(0.0, SIM_WORKLOADS[workload])]
    if scenario.get("mix_change"):
        phases.append((scenario["mix_change"]["at_s"], SIM_WORKLOADS[scenario["mix_change"]["to"]]))
    schedule = BudgetSchedule.parse(scenario["schedule"])
    governor.set_budget(schedule.first_w)
    trace = run(governor, plant, scenario["seconds"], schedule, workloads=phases)
    trace["board_energy_mj"] = trace["true_energy_mj"]  # an independent reader of the counter
    tenants = [dict(t, alone_w=plant.idle_w + st.watts) for t, st in zip(scenario["tenants"], plant.tenants)]
    facts = ScenarioFacts(schedule=schedule, tenants=tenants, idle_w=plant.idle_w,
                          nvml_failures=[tuple(span) for span in scenario["nvml_failures"]],
                          phases=[(start, w.name) for start, w in phases])
    return trace, facts


# ---- model steps on the simulated GPU -------------------------------------------------------
@dataclass(frozen=True)
class StepProfile:
    """What one configuration of a model's step does on the simulated board: GPU seconds per
    step at full duty and the watts drawn while it computes."""

    seconds: float
    watts: float


class SimTelemetry:
    """What the controller reads of NVML's identity for a simulated board (its readings come
    from SimStepGpu, which ticks the controller itself)."""

    available = True
    reason = None

    def __init__(self, cap_w: float):
        self.devices = [{"power_limit_enforced_w": cap_w, "uuid": "GPU-sim"}]

    def close(self) -> None:
        pass


class SimStepGpu:
    """A simulated GPU running a model's steps, in simulated time.

    A step computes for its GPU seconds, block after block (`blocks` pacing points per step,
    as an attached model's block hooks give), drawing its configuration's watts; the
    controller's pacer idles it by sleeping, which here advances the clock at idle power.
    Power follows with the plant's lag, the energy counter integrates it, the temperature
    follows the plant's thermal model, and every 0.1 s of simulated time the sensor's
    reading ticks the controller (as its sensor thread does on a GPU), through `on_tick`."""

    def __init__(self, plant: Plant, profiles: dict, tokens_per_step: int = 8192, blocks: int = 16,
                 watts_scale: float = 1.0, seed: int = 0, sensor_window_s: float = 0.05):
        self.plant, self.profiles, self.tokens_per_step, self.blocks = plant, profiles, tokens_per_step, blocks
        self.watts_scale = watts_scale
        self.t = 0.0
        self.power = plant.idle_w
        self.temp = plant.start_temp_c if plant.start_temp_c is not None else plant.steady_temp_c(plant.idle_w)
        self.energy_j = 0.0
        self.rng = random.Random(seed)
        self.next_tick = plant.sensor_period_s
        self.on_tick = None  # the controller's tick
        self.rows: list[dict] = []  # the truth at each tick
        self.steps = 0
        self.nvml_dead: list[tuple[float, float]] = []
        # NVML's "instant" power is the board's power over a short window of its own, not a
        # point sample: a duty cycle of tens of milliseconds shows as its average, not its phase.
        self.sensor_window_s = sensor_window_s
        self._recent: list[tuple[float, float, float]] = []  # (end t, seconds, watts) of each slice

    def clock(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        self.advance(seconds, None)

    def advance(self, seconds: float, busy_w: float | None) -> None:
        end = self.t + max(0.0, seconds)
        while self.t < end - 1e-12:
            dt = min(self.plant.dt, end - self.t, self.next_tick - self.t)
            target = self.plant.idle_w if busy_w is None else min(self.plant.cap_w, busy_w)
            self.power += (target - self.power) * min(1.0, dt / self.plant.lag_s)
            self.temp += (self.plant.steady_temp_c(self.power) - self.temp) * dt / self.plant.thermal_tau_s
            self.energy_j += self.power * dt
            self.t += dt
            self._recent.append((self.t, dt, self.power))
            if self.t >= self.next_tick - 1e-12:
                self.next_tick += self.plant.sensor_period_s
                self._tick()

    def _sensed_w(self) -> float:
        since = self.t - self.sensor_window_s
        self._recent = [(t, dt, w) for t, dt, w in self._recent if t > since + 1e-12]
        spans = [(min(dt, t - since), w) for t, dt, w in self._recent]
        seconds = sum(s for s, _ in spans)
        watts = sum(s * w for s, w in spans) / seconds if seconds > 0 else self.power
        return watts + self.rng.gauss(0.0, self.plant.noise_w)

    def _tick(self) -> None:
        dead = any(a <= self.t < b for a, b in self.nvml_dead)
        reading = Reading(self.t, None if dead else self._sensed_w(),
                          None if dead else self.energy_j * 1e3, temp_c=None if dead else round(self.temp),
                          error="NVMLError_Unknown: simulated sensor failure" if dead else None)
        self.rows.append({"t": self.t, "true_power_w": self.power, "true_energy_mj": self.energy_j * 1e3,
                          "true_temp_c": self.temp, "steps": self.steps})
        if self.on_tick is not None:
            self.on_tick(reading)

    def step_fn(self, ctl, profile_of=None):
        """The step function a controller runs: block after block, a pacing point before each."""
        def step(plan):
            profile = (profile_of or (lambda p: self.profiles[p.label]))(plan)
            for _ in range(self.blocks):
                ctl.pace()
                self.advance(profile.seconds / self.blocks, profile.watts * self.watts_scale)
            self.steps += 1
            return self.steps
        return step


def sim_controller(gpu: SimStepGpu, mode: str = "budget", budget_w: float | None = 450.0, **kw):
    """A real Controller on the simulated board: its clock, sleep and sensor ticks are the board's."""
    from flashwatt.control.controller import Controller
    from flashwatt.control.pacing import DeviceOps

    ctl = Controller(mode, budget_w, "cpu", telemetry=SimTelemetry(gpu.plant.cap_w), idle_w=gpu.plant.idle_w,
                     sensor=False, clock=gpu.clock, sleep=gpu.sleep, device_ops=DeviceOps(None, gpu.clock),
                     cache=None, **kw)
    gpu.on_tick = ctl.tick
    return ctl


def run_steps(ctl, gpu: SimStepGpu, seconds: float, budget_schedule=(), step=None) -> pd.DataFrame:
    """Steps under `ctl` for `seconds` of simulated time; the controller's trace beside the truth."""
    fn = step or gpu.step_fn(ctl)
    schedule = _budget_timeline(budget_schedule)
    while gpu.t < seconds:
        while schedule and schedule[0][0] <= gpu.t:
            ctl.set_budget(schedule.pop(0)[1])
        ctl.step(fn, tokens=gpu.tokens_per_step)
    trace = ctl.trace()
    truth = pd.DataFrame(gpu.rows)
    if len(trace):
        trace = pd.merge_asof(trace.sort_values("t"), truth, on="t", direction="nearest")
    return trace

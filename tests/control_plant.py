"""A simulated GPU for the control logic's tests, calibrated to an H100: what a duty draws
and delivers, how fast the board's power follows it, what NVML's instant reading and its
energy counter show of it (lag, averaging, noise), a cap that clips, a first-order thermal
model (the temperature relaxes toward ambient + c x power with a time constant of tens of
seconds, read in whole degrees), and what a shared node adds: other tenants' watts (and the
GPU time they take), NVML read failures, a shape mix that changes, a budget that steps and
ramps.

Model steps (`SimStepGpu`, `sim_controller`, `run_steps`): the real Controller drives a
simulated board whose clock, sleep and sensor ticks are the board's, so its pacer's sleeps
idle the board and a step's blocks compute on it, all in simulated time.

The governor under test is the real one; only the GPU and the clock are simulated, in
simulated time, so a 20 s scenario takes a fraction of a second and is the same every run.
`simulate(scenario)` runs a generated scenario (flashwatt.control.scenario_generator) and
returns its trace with the facts the figures of merit need, `oracle_rows` the static rows
(every configuration at a grid of duties) a run is judged against, as the oracle job
measures them on a GPU, and `replay` a recorded sequence of duties (the calibration test).

Where the constants come from: an NVIDIA H100 80GB HBM3 (driver 580.159.04, 700 W enforced
limit, torch 2.11.0+cu130) through the workflow's `control_heldout` suite (seed 4141: 20
generated scenarios of 5 s on the steady workload, B4 H16 L4096 D128 bf16, an energy run
and the oracles). Every controller tick of its traces (duty, configuration, instant reading,
energy counter, tokens) was replayed through this model and its constants fitted by least
squares; tests/data/h100_heldout_ticks.csv keeps five of those runs (285 ticks) and
tests/data/h100_heldout_oracle.csv the oracle's rows, and tests/test_control_plant.py holds
the model to them.
"""
from __future__ import annotations

import collections
import math
import random
from dataclasses import dataclass, field, replace

import pandas as pd

from flashwatt.control.budget_schedule import BudgetSchedule
from flashwatt.control.configuration import Configuration
from flashwatt.control.counter_power import CounterPower, windowed
from flashwatt.control.duty_mix import DutyMix
from flashwatt.control.governor import Governor, Reading, Work
from flashwatt.control.scenario_merit import ScenarioFacts

SHAPE = ((4, 16, 4096, 128), (4, 16, 4096, 128), False, "bf16")
TOKENS_PER_CALL = 4 * 4096

# ---- the H100's constants (module docstring) ----------------------------------------------
# Idle power the suite's jobs read before starting (126.9-129.6 W over the 21 runs).
IDLE_W = 128.0
# The enforced limit the governor is given, and the average the board's own limiter holds
# at full duty under it (the oracle's full-duty rows: 679-699 W; the energy run: 693 W).
LIMIT_W = 700.0
CAP_W = 695.0
# Watts above idle per unit of busy time, uncapped (cuDNN, fitted to the instant readings:
# 745 W left a mean residual of +0.7 W over 270 paced ticks; the oracle's paced rows give
# 712-741 W). Reached at full duty it would be 873 W: the cap clips from a duty of ~0.77.
BUSY_W = 745.0
# Pacing delivers a little less busy time than its duty at low duties (a sleep and a
# synchronisation per quantum): busy = duty * (1 - PACE_LOSS * (1 - duty) ** 3). Fitted to
# the tokens of every paced tick (bias -0.9%): 0.89 x the duty at 0.1, 0.95 at 0.3, 0.98 at 0.5.
PACE_LOSS = 0.15
# The board's power follows a new duty with this time constant, and the instant reading
# (NVML field 186) averages about the last SENSOR_WINDOW_S of it: a reading answers the duty
# of the tick it closes (weight 0.92) and hardly the one before (0.11). Fitted jointly
# (residual 36.8 W rms per tick).
LAG_S = 0.03
SENSOR_WINDOW_S = 0.05
# What is left of a reading once the duty's power is explained is white (lag-1
# autocorrelation 0.05) and grows with the watts above idle: 11.5% of them at every paced
# level (18 W at ~150 W above idle, 49 W at ~450 W). Part of it is the board's (the energy
# counter sees it too: 1 s averages of the two residuals correlate at 0.56), the rest the
# reading's own (the split fitted so that a replay gives the readings' 34 W rms and the
# counter's 1 s windows' 15.7 W rms about the model, as measured):
# - RIPPLE: the board's power, fresh every 0.1 s (pacing and clocks at millisecond scale);
# - WANDER, WANDER_S: a slow drift of the busy time a duty gives, watts and tokens alike
#   (pacing, clocks; it is what a duty -> power table learned a second ago gets wrong), an
#   AR(1) process;
# - SENSOR_NOISE: the reading's own, white, at most SENSOR_NOISE_MAX_W (at full duty the
#   readings spread +-42 W around the limiter while 1 s of the counter varies by 3.5 W).
RIPPLE = 0.05
WANDER = 0.04
WANDER_S = 5.0
SENSOR_NOISE = 0.10
SENSOR_NOISE_MAX_W = 45.0
# The energy counter as read at a tick shows the energy of COUNTER_DELAY_S before (its
# 0.1 s differences follow the duty of the tick before as much as the one they close:
# weights 0.41 and 0.50), read with an error (joules, white) of COUNTER_ERROR_S x the watts
# above idle plus COUNTER_SWING_S x the change of power over the last tick: the counter's
# 0.1 s differences left a median of 11 W about the model where the duty held still and
# 21 W where it moved by 0.1 or more (trimmed rms 20 and 52 W). Now and then a read returns
# the value of the read before (a 0.1 s difference of 0 W, and the next one twice the power):
# 6 such stalls in 898 ticks, 5 of them in one run; here each run stalls at
# COUNTER_STALL_RUN of its reads with probability COUNTER_STALLING, else at COUNTER_STALL.
COUNTER_DELAY_S = 0.04
COUNTER_ERROR_S = 0.003
COUNTER_SWING_S = 0.02
COUNTER_STALL = 0.002
COUNTER_STALLING = 0.05
COUNTER_STALL_RUN = 0.1


@dataclass
class Profile:
    """What one configuration does on the simulated board."""

    tokens_per_s: float  # at full duty
    power_full_w: float  # drawn at full duty, before the board's cap
    # Watts above idle per unit of busy time when paced; by default the line from idle to
    # full duty. On the H100 paced calls draw more per token than back to back (idle gaps
    # and full clocks in the bursts, lower clocks at full duty): the line from idle at this
    # slope meets power_full_w before full duty, and power stays there.
    busy_w: float | None = None
    # How pacing costs this configuration's calls busy time, where it differs from the board's
    # (Plant.pace_loss, cubic): busy = duty * (1 - pace_loss * (1 - duty) ** pace_exponent).
    # Short calls lose more of it to each quantum's drain and sleep (the H200's stream).
    pace_loss: float | None = None
    pace_exponent: float = 3.0


CUDNN = Configuration("sdpa_cudnn")
CUSTOM = Configuration("custom")
CTAS66 = Configuration("custom", "ctas66")
CTAS33 = Configuration("custom", "ctas33")
FLASH = Configuration("sdpa_flash")
EFFICIENT = Configuration("sdpa_efficient")
# A board for the logic's tests (not measured): cuDNN fastest at the cap, our kernel next,
# a CTA cap drawing less at a much lower throughput.
PROFILES = {
    CUSTOM: Profile(tokens_per_s=13.6e6, power_full_w=760),
    CTAS33: Profile(tokens_per_s=4.8e6, power_full_w=500),
    CUDNN: Profile(tokens_per_s=17.0e6, power_full_w=690),
    FLASH: Profile(tokens_per_s=9.8e6, power_full_w=760),
}
# The H100 at B4 H16 L4096 D128 bf16, in the controller's order of candidates: tokens/s and
# watts at full duty from the oracle (our kernel and cuDNN within 1%, FlashAttention-2 at
# 0.57x); the CTA caps and the memory-efficient backend from the control suite's oracle on
# the same board (docs/control.md). Paced, our kernel drew what cuDNN did at each duty (its
# ticks), BUSY_W per unit of busy time.
H100_STEADY = {
    CUSTOM: Profile(17.92e6, 698.8, busy_w=BUSY_W),
    CTAS66: Profile(8.9e6, 695.0, busy_w=BUSY_W),
    CTAS33: Profile(4.9e6, 497.0),
    CUDNN: Profile(17.81e6, 692.3, busy_w=BUSY_W),
    FLASH: Profile(10.10e6, 692.7, busy_w=BUSY_W),
    EFFICIENT: Profile(5.2e6, 696.0, busy_w=BUSY_W),
}


@dataclass(frozen=True)
class SimWorkload:
    """The shapes of successive calls, each with what every configuration does on it; several
    shapes are mixed call by call (an equal share of the time each)."""

    name: str
    shapes: tuple  # ((shape, {config: Profile}), ...)
    # More white noise on a reading while this workload runs, of the watts above idle: a
    # reading averages a few dozen calls, and shapes that draw differently make it jumpy.
    reading_noise: float = 0.0


_SHORT = ((64, 8, 512, 64), (64, 8, 512, 64), False, "bf16")
_MID = ((32, 8, 1024, 64), (32, 8, 1024, 64), False, "bf16")
_LONG = ((32, 8, 2048, 64), (32, 8, 2048, 64), False, "bf16")


def _stream_shapes() -> tuple:
    # Three shapes of the seed's mix (H8 D64): our kernel fastest on the short one, cuDNN on
    # the long ones, as on the H100.
    return (
        (_SHORT, {CUSTOM: Profile(30e6, 620), CTAS33: Profile(9e6, 450), CUDNN: Profile(24e6, 600),
                  FLASH: Profile(20e6, 640)}),
        (_MID, {CUSTOM: Profile(22e6, 680), CTAS33: Profile(7e6, 470), CUDNN: Profile(23e6, 650),
                FLASH: Profile(15e6, 700)}),
        (_LONG, {CUSTOM: Profile(15e6, 720), CTAS33: Profile(5e6, 480), CUDNN: Profile(19e6, 680),
                 FLASH: Profile(11e6, 740)}),
    )


def _h100_stream_shapes() -> tuple:
    # The same three shapes scaled to the H100's stream oracle (the mix's average): cuDNN
    # 146 M tokens/s at 699 W, paced 690 W above idle per busy second (its 0.3/0.5/0.7 rows
    # give 725/714/651); our kernel 144 M at 671 W, under the cap, and paced as many tokens
    # per watt as cuDNN paced (the held-out runs drew 1.00-1.07 of the front's throughput at
    # the watts they drew on the mix); FlashAttention-2 100 M.
    def shape(custom, cudnn, flash, ctas33, custom_full_w, custom_busy_w):
        return {CUSTOM: Profile(custom, custom_full_w, busy_w=custom_busy_w),
                CTAS66: Profile(0.5 * custom, 695.0, busy_w=700.0), CTAS33: Profile(ctas33, 480.0),
                CUDNN: Profile(cudnn, 699.0, busy_w=690.0), FLASH: Profile(flash, 691.3, busy_w=690.0),
                EFFICIENT: Profile(0.35 * cudnn, 695.0, busy_w=700.0)}
    return (
        (_SHORT, shape(193e6, 159.5e6, 130.6e6, 58.5e6, 660.0, 676.0)),
        (_MID, shape(141.6e6, 152.8e6, 98.0e6, 45.5e6, 670.0, 687.0)),
        (_LONG, shape(96.5e6, 126.3e6, 71.9e6, 32.5e6, 683.0, 698.0)),
    )


STEADY = SimWorkload("steady", ((SHAPE, PROFILES),))
STREAM = SimWorkload("stream", _stream_shapes())
SIM_WORKLOADS = {"steady": STEADY, "stream": STREAM}
# On the H100 the stream mix's readings left 18.6% of the watts above idle about the model
# (four held-out runs, 101 ticks) where the steady shape's left 11.5%; its counter's 1 s
# windows spread no more than the steady shape's: the rest is the reading's.
STREAM_READING_NOISE = 0.146
H100_WORKLOADS = {"steady": SimWorkload("steady", ((SHAPE, H100_STEADY),)),
                  "stream": SimWorkload("stream", _h100_stream_shapes(), reading_noise=STREAM_READING_NOISE)}

# ---- an NVIDIA H200 (700 W limit, driver 580.159.04, torch 2.11.0+cu130) --------------------
# Fitted to the oracles of two runs of the held-out suite (tests/data/h200_heldout_oracle.csv)
# and the 2 ms pacing study on the same board (docs/control.md): idle 120-121 W, the limiter
# holding 684-698 W at full duty. Steady shape: 720 W above idle per busy second, pacing
# costing busy time as on the H100 (cubic), a little more (0.2). Stream: 675 W above idle per
# busy second, and pacing costs its short calls much more, nearly in proportion to the idle
# (0.29 (1 - duty): busy 0.24 of the time at duty 0.3, 0.64 at 0.7, 0.81 at 0.85), so duty 0.85
# draws nearly what full duty draws for 0.85 of its tokens. Our kernel ties cuDNN on every
# shape of the mix (the controller chose cuDNN for nearly all of them), unlike the H100's.
# The CTA caps and the memory-efficient backend were not in the H200's oracle: by the H100's
# ratios to our kernel and cuDNN.
H200_IDLE_W = 120.0
H200_CAP_W = 688.0
H200_STEADY_BUSY_W = 720.0
H200_STEADY_PACE_LOSS = 0.2
H200_STREAM_BUSY_W = 675.0
H200_STREAM_PACE_LOSS = 0.29


def _h200_profiles(custom: float, cudnn: float, flash: float, busy_w: float, pace_loss: float,
                   exponent: float) -> dict:
    def paced(tokens: float, full_w: float = 700.0) -> Profile:
        return Profile(tokens, full_w, busy_w=busy_w, pace_loss=pace_loss, pace_exponent=exponent)
    return {CUSTOM: paced(custom), CTAS66: paced(0.5 * custom), CTAS33: Profile(0.27 * custom, 480.0),
            CUDNN: paced(cudnn), FLASH: paced(flash), EFFICIENT: paced(0.3 * cudnn)}


H200_STEADY = _h200_profiles(17.84e6, 17.57e6, 10.07e6, H200_STEADY_BUSY_W, H200_STEADY_PACE_LOSS, 3.0)
H200_WORKLOADS = {
    "steady": SimWorkload("steady", ((SHAPE, H200_STEADY),)),
    "stream": SimWorkload("stream", tuple(
        (shape, _h200_profiles(143.7e6, 145.3e6, 100.1e6, H200_STREAM_BUSY_W, H200_STREAM_PACE_LOSS, 1.0))
        for shape in (_SHORT, _MID, _LONG)), reading_noise=STREAM_READING_NOISE),
}


def h200_plant(seed: int = 0, **kw) -> "Plant":
    return Plant(H200_STEADY, idle_w=H200_IDLE_W, cap_w=H200_CAP_W, seed=seed, **kw)


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


def busy_share(duty: float, pace_loss: float = PACE_LOSS, exponent: float = 3.0) -> float:
    """The share of time the GPU runs our calls when paced at `duty` (module constants)."""
    return duty * (1.0 - pace_loss * (1.0 - duty) ** exponent)


@dataclass
class Plant:
    profiles: dict[Configuration, Profile]
    idle_w: float = IDLE_W
    cap_w: float = CAP_W
    lag_s: float = LAG_S
    sensor_window_s: float = SENSOR_WINDOW_S
    sensor_noise: float = SENSOR_NOISE  # of the watts above idle
    sensor_noise_max_w: float = SENSOR_NOISE_MAX_W
    noise_w: float = 0.0  # more white noise on each reading, in watts
    ripple: float = RIPPLE
    wander: float = WANDER
    wander_s: float = WANDER_S
    counter_delay_s: float = COUNTER_DELAY_S
    counter_error_s: float = COUNTER_ERROR_S
    counter_swing_s: float = COUNTER_SWING_S
    counter_stall: float | None = None  # the share of reads that stall; None: drawn per run (above)
    pace_loss: float = PACE_LOSS
    sensor_period_s: float = 0.1
    dt: float = 0.01
    curve: float = 1.0  # power above idle grows as busy ** curve (on the H100: linear up to the cap)
    # A table error that depends on the duty (off by default): above a busy share of
    # `convex_from` the board draws more watts above idle than the curve below it gives, by a
    # share growing linearly to `convex_share` more at full busy (Plant.convex_factor). A
    # duty -> power table, and the share of it the board draws, learned under that busy share
    # is then too low above it: on the H200 a share learned at duty ~0.7 was 1.1-1.15x too low
    # at duty 0.95 and more (docs/control.md, "On an NVIDIA H200"). The drift of `wander`, by
    # contrast, is one share at every duty, which a share learned anywhere follows.
    convex_from: float = 1.0
    convex_share: float = 0.0
    disturbance: list[tuple[float, float]] = field(default_factory=list)  # (from t, extra W)
    burst_w: float = 0.0  # a bursty tenant: each 0.3 s its watts move by up to this much
    tenants: list[SimTenant] = field(default_factory=list)
    telemetry_dead_after: float | None = None
    telemetry_dead: list[tuple[float, float]] = field(default_factory=list)  # (from t, to t): reads fail
    # For this long from the run's start the board reads idle whatever runs (on the H200 a run's
    # first readings showed the idle board for up to 0.2 s while its calls ran).
    wake_s: float = 0.0
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

    def _busy(self, duty: float, t: float, prof: Profile | None = None) -> float:
        if prof is not None and prof.pace_loss is not None:
            share = busy_share(duty, prof.pace_loss, prof.pace_exponent)
        else:
            share = busy_share(duty, self.pace_loss)
        return share * (1 - self._share(t))  # time a tenant takes we do not draw

    def _ours_w(self, prof: Profile, busy: float) -> float:
        return min(prof.power_full_w - self.idle_w, self._drive_w(prof, busy))

    def _drive_w(self, prof: Profile, busy: float) -> float:
        """Our watts above idle at this busy share before the profile saturates at full duty."""
        slope = prof.busy_w if prof.busy_w is not None else prof.power_full_w - self.idle_w
        return slope * busy ** self.curve * self.convex_factor(busy)

    def convex_factor(self, busy: float) -> float:
        """How much more than the curve below `convex_from` the board draws above idle at
        this busy share: 1 up to there, then rising linearly to 1 + `convex_share` at full
        busy."""
        if self.convex_share == 0.0 or busy <= self.convex_from:
            return 1.0
        return 1.0 + self.convex_share * (busy - self.convex_from) / (1.0 - self.convex_from)

    def target_w(self, config: Configuration, duty: float, t: float, profiles: dict | None = None) -> float:
        """The board's average power at this duty, without noise."""
        return min(self.cap_w, self.uncapped_w(config, duty, t, profiles))

    def uncapped_w(self, config: Configuration, duty: float, t: float, profiles: dict | None = None) -> float:
        """What the board would draw at this duty without its limiter."""
        prof = (profiles or self.profiles)[config]
        return self.idle_w + self._ours_w(prof, self._busy(duty, t, prof)) + self._extra_w(t)

    def drive(self, config: Configuration, duty: float, t: float, profiles: dict | None = None) -> tuple[float, float, float]:
        """(watts before any saturation, the most the board draws with this configuration
        now, busy share): what `Board.step` takes. Noise rides on the first; a board at its
        ceiling (the cap, or the configuration's own full-duty watts) stays there."""
        prof = (profiles or self.profiles)[config]
        busy = self._busy(duty, t, prof)
        extra = self._extra_w(t)
        ceiling = min(self.cap_w, prof.power_full_w + extra)
        if t < self.wake_s:
            return self.idle_w + extra, ceiling, busy
        return self.idle_w + self._drive_w(prof, busy) + extra, ceiling, busy

    def throughput(self, config: Configuration, duty: float, t: float, profiles: dict | None = None) -> float:
        """Tokens/s. A profile's full-duty throughput was measured at the cap, so the cap
        alone does not slow it; another tenant's watts that leave less room under the cap
        than we draw alone at full duty do (the board lowers the clocks for both)."""
        prof = (profiles or self.profiles)[config]
        busy = self._busy(duty, t, prof)
        ours = self._ours_w(prof, busy)
        extra = self._extra_w(t)
        if extra > 0 and self.idle_w + ours + extra > self.cap_w:
            room = max(0.0, self.cap_w - extra - self.idle_w)
            alone = min(ours, self.cap_w - self.idle_w)
            return prof.tokens_per_s * busy * min(1.0, room / alone) if alone > 0 else 0.0
        return prof.tokens_per_s * busy

    def dead(self, t: float) -> bool:
        if self.telemetry_dead_after is not None and t >= self.telemetry_dead_after:
            return True
        return any(start <= t < end for start, end in self.telemetry_dead)


class Board:
    """The board's state through a run: its power (lagging what the duty draws, with its
    ripple and drift), what the instant reading averages, and the energy counter."""

    def __init__(self, plant: Plant):
        self.plant = plant
        self.rng = random.Random(plant.seed)
        self.power = plant.idle_w
        self.energy_j = 0.0
        self.t = 0.0
        # the temperature, and its noise apart so that the power's draws stay as they were
        self.temp = plant.start_temp_c if plant.start_temp_c is not None else plant.steady_temp_c(plant.idle_w)
        self._heat = random.Random(plant.seed + 2)
        self._drift = self.rng.gauss(0.0, plant.wander)  # a run starts anywhere in the drift's range
        stalling = self.rng.random() < COUNTER_STALLING
        self.stall = plant.counter_stall if plant.counter_stall is not None else (
            COUNTER_STALL_RUN if stalling else COUNTER_STALL)
        self._last_read: float | None = None
        self._ripple_block = None
        self._ripple = 0.0
        n = max(1, round(plant.sensor_window_s / plant.dt))
        self._recent = collections.deque([plant.idle_w] * n, maxlen=n)
        self._history = collections.deque(maxlen=max(2, round(plant.counter_delay_s / plant.dt) + 2))
        self._last_tick = collections.deque([plant.idle_w], maxlen=max(1, round(plant.sensor_period_s / plant.dt)) + 1)

    def step(self, drive_w: float, ceiling_w: float, busy: float) -> None:
        """Advance one plant step toward `drive_w` (what the duty draws, noiseless, before
        saturating at `ceiling_w`) at this busy share of the time."""
        p = self.plant
        if p.wander:
            a = p.dt / p.wander_s
            self._drift += -a * self._drift + p.wander * math.sqrt(2 * a) * self.rng.gauss(0.0, 1.0)
        block = int(self.t / p.sensor_period_s + 1e-9)
        if block != self._ripple_block:
            self._ripple_block, self._ripple = block, self.rng.gauss(0.0, 1.0) * p.ripple
        # The limiter holds the average: a board at its ceiling does not drift or ripple over it.
        above = max(0.0, drive_w - p.idle_w) * (1.0 + self._drift + self._ripple)
        wanted = min(ceiling_w, p.idle_w + above)
        self.power += (wanted - self.power) * (1.0 - math.exp(-p.dt / p.lag_s))
        self._history.append((self.t, self.energy_j))
        self.energy_j += self.power * p.dt
        self.temp += (p.steady_temp_c(self.power) - self.temp) * p.dt / p.thermal_tau_s
        self._recent.append(self.power)
        self._last_tick.append(min(ceiling_w, drive_w))
        self.t += p.dt

    def busy_gain(self, busy: float) -> float:
        """The drift moves the busy time a duty gives (pacing, clocks): tokens with it, as
        watts, up to the whole of the time."""
        return min(1.0 + self._drift, 1.0 / busy) if busy > 0 else 1.0

    def reading(self, extra_noise: float = 0.0) -> float:
        """NVML's instant power now (`extra_noise`: more of it, of the watts above idle)."""
        p = self.plant
        mean = sum(self._recent) / len(self._recent)
        above = max(0.0, mean - p.idle_w)
        sd = math.hypot(min(p.sensor_noise_max_w, p.sensor_noise * above), extra_noise * above)
        return mean + self.rng.gauss(0.0, sd) + (self.rng.gauss(0.0, p.noise_w) if p.noise_w else 0.0)

    def temp_reading(self) -> int:
        """NVML's temperature now: whole degrees."""
        return round(self.temp + self._heat.gauss(0.0, self.plant.temp_noise_c))

    def energy_at_delay(self) -> float:
        """Joules the board drew until COUNTER_DELAY_S ago (what the counter shows now)."""
        delayed = self.energy_j
        for t, energy in self._history:
            if t <= self.t - self.plant.counter_delay_s + 1e-9:
                delayed = energy
        return delayed

    def counter_mj(self) -> float:
        """The energy counter as a read now returns it (delayed, with the read's error)."""
        p = self.plant
        delayed = self.energy_at_delay()
        swing = abs(self._last_tick[-1] - self._last_tick[0])
        sd = p.counter_error_s * max(0.0, self.power - p.idle_w) + p.counter_swing_s * swing
        value = (delayed + self.rng.gauss(0.0, sd)) * 1e3
        if self._last_read is not None and self.rng.random() < self.stall:
            return self._last_read  # the counter did not move since the read before
        self._last_read = value
        return value


def _budget_timeline(budget_schedule) -> list[tuple[float, float]]:
    if isinstance(budget_schedule, BudgetSchedule):
        return budget_schedule.timeline(0.1)
    return sorted(budget_schedule)


class CyclePacing:
    """Attention calls paced in whole cycles (flashwatt.control.pacing, `target_cycle_s`):
    busy at full duty until a cycle's busy share is owed, then idle for what that owes at the
    duty in force, re-read as it is paid; and what the controller then hands the governor,
    the energy counter's average over the last two cycles with the duty realized in it
    (flashwatt.control.counter_power), once a cycle is longer than a tick."""

    def __init__(self, cycle_s: float, period_s: float):
        self.cycle_s, self.period_s = cycle_s, period_s
        self.owed_busy = 0.0
        self.idle = False
        self.idle_s = 0.0  # idle paid so far
        self.counter = CounterPower()

    def busy(self, duty: float, dt: float) -> bool:
        """Whether the board computes for the next `dt` at this duty."""
        if duty >= 1.0:
            self.idle, self.owed_busy = False, 0.0
            return True
        ratio = (1.0 - duty) / duty
        if self.idle:
            self.owed_busy -= dt / ratio
            self.idle_s += dt
            if self.owed_busy <= 0.0:
                self.idle, self.owed_busy = False, 0.0
            return False
        self.owed_busy += dt
        if self.owed_busy * ratio >= self.cycle_s * (1.0 - duty):
            self.idle = True
        return True

    def reading(self, reading: Reading) -> Reading:
        self.counter.add(reading.t, reading.energy_mj, self.idle_s)
        return windowed(self.counter, reading, self.cycle_s, self.period_s)


class MixPacing:
    """Attention calls on a mix of two duties (flashwatt.control.duty_mix, `pace_mix=(low,
    period_s)`): for a duty between `low` and full, full duty for the share (d - low) / (1 - low)
    of each period and `low`, paced as ever, for the rest; other duties as they are; and what
    the controller then hands the governor, the energy counter's average over the last two
    periods with the duty realized in it (flashwatt.control.counter_power). The host's queue
    is not modelled (the pacer's handling of it: tests/test_control_duty_mix.py, QueuedGpu)."""

    def __init__(self, low: float, period_s: float, sensor_period_s: float):
        # (the controller's own share of a period at full duty, and its checks of low and period)
        self.mix = DutyMix(lambda: 1.0, low, period_s, lambda: 0.0)
        self.period_s, self.sensor_period_s = period_s, sensor_period_s
        self.idle_s = 0.0
        self.counter = CounterPower()

    def duty(self, duty: float, t: float, dt: float) -> float:
        """The duty the board runs at for the next `dt` under the governor's `duty`."""
        if self.mix.low < duty < 1.0:
            duty = 1.0 if t % self.period_s < self.mix.full_share(duty) * self.period_s else self.mix.low
        self.idle_s += dt * (1.0 - duty)
        return duty

    def reading(self, reading: Reading) -> Reading:
        self.counter.add(reading.t, reading.energy_mj, self.idle_s)
        return windowed(self.counter, reading, self.period_s, self.sensor_period_s)


def run(governor: Governor, plant: Plant, seconds: float, budget_schedule=(), shape: tuple = SHAPE,
        workloads: list[tuple[float, SimWorkload]] | None = None, cycle_s: float = 0.0,
        mix: tuple[float, float] | None = None) -> pd.DataFrame:
    """Drive the governor for `seconds` of simulated time; its trace, with the board's true
    power and energy (`true_power_w`, `true_energy_mj`) and the counter as read
    (`counter_mj`, also in the governor's readings). `workloads`: (from t, workload) to
    change the shape mix mid-run (default: `shape` alone with the plant's profiles).
    `cycle_s`: pacing in whole cycles of this length (CyclePacing) instead of at the duty;
    `mix`: (low duty, period) of a mix of two duties (MixPacing)."""
    if cycle_s and mix:
        raise ValueError("pacing cycles or a mix of duties, not both")
    pacing = CyclePacing(cycle_s, plant.sensor_period_s) if cycle_s else None
    mixing = MixPacing(*mix, plant.sensor_period_s) if mix else None
    pick = random.Random(plant.seed + 1)  # which shape each call is
    clock = {"t": 0.0}
    governor.clock = lambda: clock["t"]
    board = Board(plant)
    per_tick = max(1, round(plant.sensor_period_s / plant.dt))
    schedule = _budget_timeline(budget_schedule)
    phases = list(workloads) if workloads else [(0.0, SimWorkload("given", ((shape, plant.profiles),)))]
    work = Work()
    carry: dict = {}
    # The sensor reads the idle board once before the first call, as the controller's does.
    rows = [_first_tick(governor, board, phases[0][1].name)]
    for step in range(round(seconds / plant.dt)):
        t = clock["t"] = step * plant.dt
        while schedule and schedule[0][0] <= t + 1e-9:
            governor.set_budget(schedule.pop(0)[1])
        workload = [w for start, w in phases if start <= t + 1e-9][-1]
        call_shape, profiles = workload.shapes[pick.randrange(len(workload.shapes))]
        config = governor.config_for(call_shape)
        duty = governor.duty
        if pacing is not None:
            duty = 1.0 if pacing.busy(duty, plant.dt) else 0.0
        if mixing is not None:
            duty = mixing.duty(duty, t, plant.dt)
        share = plant._share(t)
        # latency samples as the controller's CUDA events would give them (slower while
        # another process takes part of the GPU's time)
        governor.on_latency(call_shape, config, TOKENS_PER_CALL / profiles[config].tokens_per_s / (1 - share),
                            TOKENS_PER_CALL)
        drive_w, ceiling_w, busy = plant.drive(config, duty, t, profiles)
        key = (call_shape, config)
        tokens = plant.throughput(config, duty, t, profiles) * board.busy_gain(busy) * plant.dt
        carry[key] = carry.get(key, 0.0) + tokens
        while carry[key] >= TOKENS_PER_CALL:
            work.add(call_shape, config, TOKENS_PER_CALL)
            carry[key] -= TOKENS_PER_CALL
        board.t = t
        board.step(drive_w, ceiling_w, busy)
        if (step + 1) % per_tick == 0:
            clock["t"] = (step + 1) * plant.dt
            rows.append(_tick(governor, plant, board, work, workload, pacing or mixing))
            work = Work()
    return pd.DataFrame(rows)


def _tick(governor: Governor, plant: Plant, board: Board, work: Work, workload: SimWorkload,
          pacing: CyclePacing | MixPacing | None = None) -> dict:
    """The sensor's tick: NVML's reading and counter (or their failure) to the governor."""
    t = governor.clock()
    dead = plant.dead(t)
    counter = board.counter_mj()
    reading = Reading(t, None if dead else board.reading(workload.reading_noise), None if dead else counter,
                      temp_c=None if dead else board.temp_reading(),
                      error="NVMLError_Unknown: simulated sensor failure" if dead else None)
    if pacing is not None:
        reading = pacing.reading(reading)
    row = governor.tick(reading, work)
    row.update(true_power_w=board.power, true_energy_mj=board.energy_j * 1e3, counter_mj=counter,
               true_temp_c=board.temp, workload=workload.name)
    return row


def _first_tick(governor: Governor, board: Board, workload: str) -> dict:
    counter = board.counter_mj()
    row = governor.tick(Reading(0.0, board.reading(), counter, temp_c=board.temp_reading()), Work())
    row.update(true_power_w=board.power, true_energy_mj=board.energy_j * 1e3, counter_mj=counter,
               true_temp_c=board.temp, workload=workload)
    return row


def replay(plant: Plant, ticks: pd.DataFrame, profiles: dict | None = None) -> pd.DataFrame:
    """A recorded run's duty and configuration, tick by tick (`t`, `duty`, `config`: a row's
    configuration is what ran since the tick before, at that tick's duty), through the
    board. Per tick: what the reading averages without any noise (`expected_w`), a reading
    (`reading_w`), the counter without and with noise (`expected_mj`, `counter_mj`, from 0)
    and the tokens since the tick before."""
    profiles = profiles or plant.profiles
    by_label = {c.label: c for c in profiles}
    boards = Board(plant), Board(replace(plant, wander=0.0, ripple=0.0))
    t = ticks["t"].to_numpy(dtype=float)
    duty = ticks["duty"].to_numpy(dtype=float)
    labels = ticks["config"].tolist()
    rows = []
    now, tokens = t[0], 0.0
    config = by_label.get(labels[0], next(iter(profiles)))
    for k in range(len(t)):
        config = by_label.get(labels[k], config) if isinstance(labels[k], str) else config
        while now < t[k] - 1e-9:
            at = now - t[0]
            for board in boards:
                board.t = at
                board.step(*plant.drive(config, duty[k - 1], at, profiles))
            tokens += plant.throughput(config, duty[k - 1], at, profiles) * boards[0].busy_gain(
                plant._busy(duty[k - 1], at, (profiles or plant.profiles).get(config))) * plant.dt
            now += plant.dt
        noisy, quiet = boards
        rows.append({"t": t[k], "expected_w": sum(quiet._recent) / len(quiet._recent), "reading_w": noisy.reading(),
                     "expected_mj": quiet.energy_at_delay() * 1e3, "counter_mj": noisy.counter_mj(),
                     "tokens": tokens})
        tokens = 0.0
    return pd.DataFrame(rows)


# ---- generated scenarios on the simulated GPU ---------------------------------------------
# A tenant's watts above idle at an intensity, fitted to the watts each tenant of the
# held-out suite drew alone (bf16 8192^2 GEMMs: 199 W at 0.24 to 528 W at 0.79; 1 GiB
# copies: 46 W at 0.23 to 195 W at 0.92), and the share of GPU time it takes from us at
# full intensity (an assumption of the simulation: processes time-slice the GPU).
TENANT_WATTS = {"gemm": (640.0, 0.82), "copy": (212.0, 0.95)}
TENANT_SHARE = 0.5


def sim_tenant(tenant: dict, plant: Plant) -> SimTenant:
    full, exponent = TENANT_WATTS[tenant["kind"]]
    watts = full * tenant["intensity"] ** exponent
    return SimTenant(tenant["start_s"], tenant["seconds"], watts, TENANT_SHARE * tenant["intensity"])


ORACLE_DUTIES = (1.0, 0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2, 0.1)


def oracle_rows(plant: Plant, workload: SimWorkload, duties=ORACLE_DUTIES, paced=None) -> list[dict]:
    """Every configuration at each duty, alone on the board: the oracle's rows (`paced`:
    the configurations run at every duty, the others at full duty only; default all). A
    workload of several shapes mixes them as `run` does, an equal share of the time each."""
    rows = []
    bare = Plant(plant.profiles, idle_w=plant.idle_w, cap_w=plant.cap_w, curve=plant.curve, pace_loss=plant.pace_loss,
                 convex_from=plant.convex_from, convex_share=plant.convex_share)
    for config in workload.shapes[0][1]:
        for duty in (duties if paced is None or config in paced else (1.0,)):
            tokens = sum(bare.throughput(config, duty, 0.0, p) for _, p in workload.shapes) / len(workload.shapes)
            power = sum(bare.target_w(config, duty, 0.0, p) for _, p in workload.shapes) / len(workload.shapes)
            rows.append({"config": config.label, "duty": duty, "tokens_per_s": tokens, "avg_power_w": power,
                         "j_per_token": power / tokens, "check_passed": True, "check_rel_err": 1e-3})
    return rows


def simulate(scenario: dict, governor: Governor, workload: str = "steady", plant: Plant | None = None,
             workloads: dict | None = None, cycle_s: float = 0.0, mix: tuple[float, float] | None = None):
    """Run a generated scenario's budget schedule, tenants, NVML failures and mix change on
    the simulated GPU (`workloads`: the workloads by name, default SIM_WORKLOADS). Returns
    (trace with the counter as read in `energy_mj` and `board_energy_mj`, ScenarioFacts
    with the tenants' watts alone)."""
    plant = plant or Plant(PROFILES)
    workloads = workloads or SIM_WORKLOADS
    plant.tenants = [sim_tenant(t, plant) for t in scenario["tenants"]]
    plant.telemetry_dead = [(s, s + d) for s, d in scenario["nvml_failures"]]
    phases = [(0.0, workloads[workload])]
    if scenario.get("mix_change"):
        phases.append((scenario["mix_change"]["at_s"], workloads[scenario["mix_change"]["to"]]))
    schedule = BudgetSchedule.parse(scenario["schedule"])
    governor.set_budget(schedule.first_w)
    trace = run(governor, plant, scenario["seconds"], schedule, workloads=phases, cycle_s=cycle_s, mix=mix)
    # The windows are judged by the board's energy as the study's meter of the counter reads it
    # (flashwatt.control.counter_meter: each update timed within a few milliseconds, the energy
    # at a tick interpolated between updates; it answers while the controller's reads fail):
    # the plant's own, where the controller reads the counter as delayed and noisy as NVML's.
    trace["board_energy_mj"] = trace["true_energy_mj"]
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
        self._busy: list[tuple[float, float]] = []  # (start t, seconds) of each stretch of work

    def clock(self) -> float:
        return self.t

    def busy_share(self, since: float) -> float:
        """The share of the time from `since` to now the board computed: the truth a realized
        duty is checked against."""
        busy = sum(max(0.0, min(seconds, start + seconds - since)) for start, seconds in self._busy)
        return busy / (self.t - since)

    def sleep(self, seconds: float) -> None:
        self.advance(seconds, None)

    def advance(self, seconds: float, busy_w: float | None) -> None:
        end = self.t + max(0.0, seconds)
        if busy_w is not None:
            self._busy.append((self.t, end - self.t))
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

    def _busy_pct(self) -> float:
        """The share of the last sensor period a step's work ran, in percent: NVML's utilization."""
        period, busy = self.plant.sensor_period_s, 0.0
        for start, seconds in reversed(self._busy):
            if start + seconds <= self.t - period:
                break
            busy += min(start + seconds, self.t) - max(start, self.t - period)
        return 100.0 * busy / period

    def _tick(self) -> None:
        dead = any(a <= self.t < b for a, b in self.nvml_dead)
        reading = Reading(self.t, None if dead else self._sensed_w(),
                          None if dead else self.energy_j * 1e3, temp_c=None if dead else round(self.temp),
                          error="NVMLError_Unknown: simulated sensor failure" if dead else None,
                          gpu_util_pct=None if dead else self._busy_pct())
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
                     **{"cache": None, **kw})
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

"""Time-sharing full duty with a lower duty in place of one duty between them
(flashwatt.control.duty_mix, `Controller(pace_mix=(low, period_s))`, a suite's `pace_mix`):
what the pacer is told over a period, what the board realizes, how the controller reads it and
where a suite sets it."""
from __future__ import annotations

import numpy as np
import pytest

from control_plant import PROFILES, Plant, SimStepGpu, StepProfile, run_steps, sim_controller
from flashwatt.control.configuration import ControlError
from flashwatt.control.duty_mix import DutyMix
from flashwatt.control.metrics import window_power
from flashwatt.control.pacing import Pacer

STEP = {"unchanged": StepProfile(0.2, 650.0)}


def answers(mix: DutyMix, clock: dict, period_s: float, samples: int = 1000) -> np.ndarray:
    """What the mix answers at evenly spread instants of one period."""
    out = []
    for i in range(samples):
        clock["t"] = 7.0 * period_s + period_s * (i + 0.5) / samples
        out.append(mix())
    return np.array(out)


@pytest.mark.parametrize("duty", [0.4, 0.55, 0.7, 0.85, 0.95])
def test_a_duty_between_low_and_full_is_their_time_sharing_over_each_period(duty):
    clock = {"t": 0.0}
    mix = DutyMix(lambda: duty, 0.3, 0.5, lambda: clock["t"])
    seen = answers(mix, clock, 0.5)
    assert set(np.round(seen, 9)) <= {1.0, 0.3}  # only the two points
    assert (seen == 1.0).mean() == pytest.approx((duty - 0.3) / 0.7, abs=0.002)
    assert seen.mean() == pytest.approx(duty, abs=0.002)  # the busy share the loop asked for


@pytest.mark.parametrize("duty", [0.05, 0.2, 0.3, 1.0])
def test_at_or_under_the_low_duty_and_at_full_duty_the_duty_is_its_own(duty):
    clock = {"t": 0.0}
    mix = DutyMix(lambda: duty, 0.3, 0.5, lambda: clock["t"])
    assert set(answers(mix, clock, 0.5, 50)) == {duty}


def test_a_duty_that_moves_within_a_period_moves_the_share_at_once():
    clock, duty = {"t": 0.0}, {"d": 0.9}
    mix = DutyMix(lambda: duty["d"], 0.3, 0.5, lambda: clock["t"])
    clock["t"] = 10.0 + 0.3  # 60 % into a period: at 0.9 (86 % at full duty) still full
    assert mix() == 1.0
    duty["d"] = 0.5  # a cut: 29 % at full duty, so this instant is already low
    assert mix() == 0.3


@pytest.mark.parametrize("bad, why", [((1.2, 0.5), "lower duty must lie in"), ((0.3, 0.0), "period must be"),
                                      ((0.3,), "give (lower duty, period"), ("often", "give (lower duty, period")])
def test_a_controller_refuses_a_mix_it_cannot_run_and_names_it(bad, why):
    gpu = SimStepGpu(Plant(PROFILES), STEP)
    with pytest.raises(ControlError, match=r"pace_mix=") as err:
        sim_controller(gpu, pace_mix=bad)
    assert why in str(err.value)


def test_a_mix_and_pacing_cycles_are_one_or_the_other():
    """A cycle pays its idle a cycle at a time, longer than a mix's low phase: together the
    idle would come periods late. A controller and a suite each refuse the pair by name."""
    from flashwatt.config import ConfigError, load_config
    from flashwatt.control.suite import control_runs

    with pytest.raises(ControlError, match=r"pace_mix=\(0.3, 0.25\) with pace_cycle_s=0.25: give one of them"):
        sim_controller(SimStepGpu(Plant(PROFILES), STEP), pace_mix=(0.3, 0.25), pace_cycle_s=0.25)
    config = load_config("config/config.yaml", configfiles=["config/overlays/control-mix.yaml"])
    config["suites"]["control_heldout"]["control"]["pace_cycle_s"] = 0.25
    with pytest.raises(ConfigError, match=r"suites\.control_heldout\.control\.pace_mix: .*not both"):
        control_runs(config, "control_heldout")


def test_a_static_step_at_a_mixed_duty_realizes_it_and_is_read_over_whole_periods():
    """Duty 0.65 as full duty half of each 0.5 s period and duty 0.3 the rest: the board is
    busy 0.65 of the time, and the readings average the counter over two periods (1 s), never
    one phase of a period."""
    gpu = SimStepGpu(Plant(PROFILES), STEP, blocks=16)
    ctl = sim_controller(gpu, "static", None, configuration="unchanged", duty=0.65, pace_mix=(0.3, 0.5))
    trace = run_steps(ctl, gpu, 10.0)
    assert gpu.busy_share(since=2.0) == pytest.approx(0.65, abs=0.03)
    late = trace[trace["t"] > 2.0]
    assert late["reading_window_s"].min() >= 0.9  # two periods
    assert late["reading_duty"].mean() == pytest.approx(0.65, abs=0.03)
    # the instant power swings between the two points; the windows do not
    truth = late["true_power_w"]
    assert truth.max() - truth.min() > 150.0
    assert late["power_w"].std() < 0.1 * late["power_w"].mean()


class QueuedGpu:
    """A GPU behind a queue, as the pacer meets a real one (the simulated boards run work as it
    is issued): the host issues work in `host_s` and runs ahead, the GPU runs it in order, an
    event stamps the end of what is queued. The DeviceOps of flashwatt.control.pacing."""

    def __init__(self, host_s: float = 1e-4):
        self.t, self.end, self.host_s = 0.0, 0.0, host_s
        self.runs: list[tuple[float, float]] = []

    def clock(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        self.t += seconds

    def launch(self, seconds: float) -> None:
        start = max(self.end, self.t)
        self.end = start + seconds
        self.runs.append((start, self.end))
        self.t += self.host_s

    def sync(self) -> None:
        self.t = max(self.t, self.end)

    def stamp(self, timing: bool = True) -> float:
        return self.end

    def done(self, stamp: float) -> bool:
        return self.t >= stamp

    def wait(self, stamp: float) -> None:
        self.t = max(self.t, stamp)

    def busy_share(self, since: float, until: float) -> float:
        runs = np.array(self.runs)
        return float(np.clip(np.minimum(runs[:, 1], until) - np.maximum(runs[:, 0], since), 0, None).sum()
                     / (until - since))


def mixed_pacer(gpu: QueuedGpu, duty) -> Pacer:
    """The pacer a controller with `pace_mix=(0.3, 0.25)` builds, at a duty (a number, or what
    the governor sets: a callable)."""
    mix = DutyMix(duty if callable(duty) else lambda: duty, 0.3, 0.25, gpu.clock)
    return Pacer(gpu, mix, clock=gpu.clock, sleep=gpu.sleep, capturing=lambda: False)


def queued_steps(gpu: QueuedGpu, pacer: Pacer, until: float, segment_s: float) -> None:
    """Steps of 16 segments (its blocks), a pacing point before each and at the end, until `until`."""
    while gpu.t < until:
        pacer.resume()
        for _ in range(16):
            pacer.point()
            gpu.launch(segment_s)
        pacer.point()
        pacer.step_ended()


@pytest.mark.parametrize("segment_s", [0.004, 0.02])
@pytest.mark.parametrize("duty", [0.45, 0.65, 0.85])
def test_steps_on_a_mix_realize_its_busy_share_on_a_gpu_with_a_queue(duty, segment_s):
    """A step's segments between pacing points (its blocks), the host running ahead of the GPU
    at full duty: the GPU is busy the share of the time the duty asks. (On an H200 the host ran
    whole steps ahead in the full phases, drained them into the low ones and owed nothing for
    them: duty 0.66 realized 0.95.)"""
    gpu = QueuedGpu()
    queued_steps(gpu, mixed_pacer(gpu, duty), 20.0, segment_s)
    assert gpu.busy_share(2.0, 19.0) == pytest.approx(duty, abs=0.04)


@pytest.mark.parametrize("duty", [0.45, 0.65, 0.85])
def test_attention_calls_on_a_mix_realize_its_busy_share_on_a_gpu_with_a_queue(duty):
    """Calls of half a millisecond, the queue bounded at 20 ms of work: what is queued when the
    low phase begins runs in it and is owed for there."""
    gpu = QueuedGpu(host_s=2e-5)
    pacer = mixed_pacer(gpu, duty)
    while gpu.t < 20.0:
        gpu.launch(5e-4)
        pacer.after_call(5e-4)
    assert gpu.busy_share(2.0, 19.0) == pytest.approx(duty, abs=0.02)


@pytest.mark.parametrize("budget", [350.0, 450.0, 550.0])
def test_a_budget_is_held_on_a_mix(budget):
    gpu = SimStepGpu(Plant(PROFILES), STEP, blocks=16)
    ctl = sim_controller(gpu, budget_w=budget, pace_mix=(0.3, 0.5))
    trace = run_steps(ctl, gpu, 20.0)
    trace["energy_mj"] = trace["true_energy_mj"]
    steady = window_power(trace).query("start >= 4")["power_w"].dropna()  # (a last window the readings end in)
    assert len(steady) >= 14 and (steady <= 1.03 * budget).mean() >= 0.95, steady.describe()
    assert steady.mean() >= 0.93 * budget


def test_a_mix_has_warm_start_tables_of_its_own(tmp_path, monkeypatch):
    """A duty on a mix draws what the line between its two points draws, not what one paced
    duty does: its tables are kept apart in the warm-start cache, as a pacing cycle's are."""
    import torch

    from flashwatt.control import controller

    monkeypatch.setattr(controller, "warm_start_key", lambda device, telemetry: {"gpu": "sim", "driver": "1"})
    keys = []
    for mix in (None, (0.3, 0.5)):
        ctl = controller.Controller.__new__(controller.Controller)
        ctl.device = torch.device("cuda", 0)  # (a key is made for a GPU only; nothing touches it here)
        ctl._pacer = type("P", (), {"target_cycle_s": 0.0})()
        ctl._mix = DutyMix(lambda: 1.0, *mix, lambda: 0.0) if mix else None
        ctl._shared = None
        keys.append(ctl._open_cache(tmp_path, None))
    assert "pace_mix" not in keys[0].key and keys[1].key["pace_mix"] == [0.3, 0.5]
    assert keys[0].path != keys[1].path


def test_a_suite_mixes_its_runs_but_not_its_oracles():
    """`pace_mix` in a suite's control section (config/overlays/control-mix.yaml) reaches each
    run; the oracle's static rows stay single duties, the points a mix time-shares."""
    from flashwatt.config import ConfigError, load_config, validate_config
    from flashwatt.control.job import scenario_of
    from flashwatt.control.suite import control_runs

    config = validate_config(load_config("config/config.yaml", configfiles=["config/overlays/control-mix.yaml"]))
    cells = control_runs(config, "control_heldout")
    runs = {cell: spec for cell, spec in cells.items() if cell.mode != "oracle"}
    oracles = [spec for cell, spec in cells.items() if cell.mode == "oracle"]
    assert oracles and all("pace_mix" not in spec for spec in oracles)
    assert {scenario_of(cell, spec).pace_mix for cell, spec in runs.items()} == {(0.3, 0.25)}
    plain = control_runs(load_config("config/config.yaml"), "control_heldout")
    assert all("pace_mix" not in spec for spec in plain.values())
    bad = load_config("config/config.yaml", configfiles=["config/overlays/control-mix.yaml"])
    bad["suites"]["control_heldout"]["control"]["pace_mix"]["period_s"] = 0.8  # two periods no longer fit 1 s
    with pytest.raises(ConfigError, match="pace_mix"):
        validate_config(bad)


@pytest.mark.parametrize("duty", [0.5, 0.85])
def test_attention_calls_on_a_mix_idle_in_its_low_phases_only(duty):
    """Calls of 1 ms under the pacer (2 ms quanta): over whole periods the busy share is the
    duty asked, and every idle falls in a phase at the lower duty."""
    from flashwatt.control.pacing import DeviceOps, Pacer

    clock = {"t": 0.0}
    sleeps = []

    def sleep(seconds):
        sleeps.append((clock["t"], seconds))
        clock["t"] += seconds
    mix = DutyMix(lambda: duty, 0.3, 0.25, lambda: clock["t"])
    pacer = Pacer(DeviceOps(None, lambda: clock["t"]), mix, clock=lambda: clock["t"], sleep=sleep)
    while clock["t"] < 5.0:
        clock["t"] += 0.001
        pacer.after_call(0.001)
    slept = sum(s for t, s in sleeps if 1.0 <= t < 5.0)
    assert 1.0 - slept / 4.0 == pytest.approx(duty, abs=0.01)
    full = mix.full_share(duty)
    # (a slice starts in a low phase; a tick of its quantum may run past the phase's end)
    starts = [(t % 0.25) / 0.25 for t, _ in sleeps]
    assert min(starts) >= full - 0.01


def test_a_mix_carries_no_more_debt_than_a_low_phase_pays_and_none_past_full_duty():
    """Idle owed when a low phase ends waits for the next low phase, but never more than one
    low phase pays (a debt grown over seconds of short low phases would idle the board for
    as long at the next cut), and none once the governor's own duty is full."""
    gpu, duty = QueuedGpu(), {"d": 0.9}  # (low phases of 36 ms, segments of 20 ms: more is owed than paid)
    pacer = mixed_pacer(gpu, lambda: duty["d"])
    most = 0.0
    while gpu.t < 5.0:
        queued_steps(gpu, pacer, gpu.t + 0.05, 0.02)
        most = max(most, pacer._owed_busy_s)
    assert most <= 0.3 * 0.25 + 1e-9
    duty["d"] = 1.0
    queued_steps(gpu, pacer, 6.0, 0.02)
    assert pacer._owed_busy_s == 0.0
    duty["d"] = 0.5
    slept_before, t_before = pacer.slept_s, gpu.t
    queued_steps(gpu, pacer, t_before + 2.0, 0.02)
    # the seconds after the cut idle about half the time, not a backlog of debt at once
    assert (pacer.slept_s - slept_before) / (gpu.t - t_before) == pytest.approx(0.5, abs=0.06)

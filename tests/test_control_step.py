"""The step-level controller (`Controller.step`, flashwatt.control.model_steps) on the simulated
GPU of tests/control_plant.py, in simulated time: the real Controller, its pacer and its
governor, with the board's clock, sleep and sensor ticks (SimStepGpu).

A simulated step computes block after block (a pacing point before each, as an attached
model's block hooks give) at its configuration's watts; `x2` splits the batch in two
micro-batches (a little slower, fewer watts)."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from control_plant import PROFILES, Plant, SimStepGpu, StepProfile, run_steps, sim_controller
from flashwatt.control.configuration import ControlError
from flashwatt.control.metrics import window_power
from flashwatt.control.pacing import DeviceOps

STEP = {"unchanged": StepProfile(0.2, 650.0), "unchanged x2": StepProfile(0.21, 570.0)}
KNOBS = {"micro_batches": [1, 2]}


def with_counter(trace):
    out = trace.copy()
    out["energy_mj"] = out["true_energy_mj"]
    return out


def steps_per_s(trace, after_s: float) -> float:
    """Steps per second after `after_s`, from the tokens credited to each tick (fractions of
    steps: counting whole steps over a few seconds would be off by one step in ten)."""
    late = trace[trace["t"] > after_s]
    return late["tokens"].sum() / 8192 / (late["t"].iloc[-1] - late["t"].iloc[0] + 0.1)


def between_steps_only(ctl, gpu: SimStepGpu):
    """The board's step run as a graphed or compiled step is: its pacing points report a
    capture (as torch.compile's tracing or a graph capture does), so it is paced between
    steps only."""
    inside = {"step": False}
    ctl._pacer.capturing = lambda: inside["step"]
    body = gpu.step_fn(ctl)

    def step(plan):
        inside["step"] = True
        try:
            return body(plan)
        finally:
            inside["step"] = False
    return step


def static_point(label: str, duty: float, profiles: dict = STEP, blocks: int = 16, step=None,
                 seconds: float = 8.0) -> tuple[float, float]:
    """(average W, steps/s) of one static configuration and duty: a point of the front.
    `step(ctl, gpu)` builds the step function (None: the board's own, paced at every block)."""
    gpu = SimStepGpu(Plant(PROFILES), profiles, blocks=blocks)
    ctl = sim_controller(gpu, "static", None, configuration=label, duty=duty)
    trace = run_steps(ctl, gpu, seconds, step=None if step is None else step(ctl, gpu))
    late = trace[trace["t"] > 2]
    watts = (late["true_energy_mj"].iloc[-1] - late["true_energy_mj"].iloc[0]) / 1e3 / (late["t"].iloc[-1] - late["t"].iloc[0])
    return watts, steps_per_s(trace, 2)


@pytest.fixture(scope="module")
def front():
    """The static front of (micro-batches x pacing), every point measured as a run."""
    return [static_point(label, duty) for label in STEP for duty in np.arange(1.0, 0.05, -0.1)]


@pytest.fixture(scope="module")
def front_between_steps():
    """The same front with the step paced between steps only (a compiled or graphed step)."""
    return [static_point(label, duty, blocks=8, step=between_steps_only) for label in STEP
            for duty in np.arange(1.0, 0.05, -0.1)]


def best_static(points, budget: float) -> float:
    """The fastest static point whose power is within the budget."""
    return max((speed for watts, speed in points if watts <= budget), default=0.0)


def front_at(points, budget: float) -> float:
    """The front's throughput at `budget`: the line between its neighbouring points (what
    time-sharing two static settings would give)."""
    ordered = sorted(points)
    best, hull = 0.0, []
    for watts, speed in ordered:
        best = max(best, speed)
        hull.append((watts, best))
    below = [p for p in hull if p[0] <= budget]
    above = [p for p in hull if p[0] > budget]
    if not below:
        return 0.0
    if not above:
        return below[-1][1]
    (w0, s0), (w1, s1) = below[-1], above[0]
    return s0 + (s1 - s0) * (budget - w0) / (w1 - w0)


@pytest.mark.parametrize("budget", [300.0, 450.0, 600.0])
def test_steps_hold_the_budget_at_the_static_front(front, budget):
    gpu = SimStepGpu(Plant(PROFILES), STEP)
    ctl = sim_controller(gpu, budget_w=budget, knobs=KNOBS)
    trace = run_steps(ctl, gpu, 30.0)
    windows = window_power(with_counter(trace))
    assert (windows["power_w"] <= budget * 1.03).mean() >= 0.95, windows
    speed = steps_per_s(trace, 10)
    assert speed >= 0.95 * best_static(front, budget), (speed, best_static(front, budget))
    # against the line between the front's points (time-sharing two static settings), less
    # the 2% margin the set point keeps under the budget, which costs most where the front is steepest
    assert speed >= 0.9 * front_at(front, budget), (speed, front_at(front, budget))
    assert ctl._pacer.points >= 16 * ctl.calls  # a pacing point at every block, and one between steps


def test_a_budget_step_is_followed_within_a_second():
    gpu = SimStepGpu(Plant(PROFILES), STEP)
    ctl = sim_controller(gpu, budget_w=600.0, knobs=KNOBS)
    trace = with_counter(run_steps(ctl, gpu, 24.0, budget_schedule=[(12.0, 350.0)]))
    windows = window_power(trace)
    after = windows[windows["start"] >= 13.0]
    assert (after["power_w"] <= 350 * 1.03).all(), after
    assert after["power_w"].mean() >= 0.9 * 350


def test_every_tick_of_a_step_is_credited_its_share_of_the_tokens():
    gpu = SimStepGpu(Plant(PROFILES), STEP)
    ctl = sim_controller(gpu, mode="energy", budget_w=None, knobs=KNOBS)
    trace = run_steps(ctl, gpu, 10.0)
    late = trace[trace["t"] > 3]
    assert (late["tokens"] > 0).all()  # no tick of a running step looks idle
    # and the credited tokens add up to the steps' (8192 each)
    assert trace["tokens"].sum() == pytest.approx(8192 * ctl.calls, rel=0.01)


def test_a_reading_of_a_window_of_pacing_cycles_records_the_duty_realized_in_it():
    """Steps paced only between steps at 300 W run in cycles longer than a tick: each reading
    averages the energy counter over whole cycles, and the trace says at which duty (the one
    realized in the window, which the loop reads it at) and over how long."""
    gpu = SimStepGpu(Plant(PROFILES), STEP, blocks=8)
    ctl = sim_controller(gpu, budget_w=300.0)
    trace = run_steps(ctl, gpu, 12.0, step=between_steps_only(ctl, gpu))
    late = trace[trace["t"] > 4]
    windowed = late[late["reading_window_s"].notna()]
    assert len(windowed) >= 0.9 * len(late)
    assert (windowed["reading_window_s"] > 0.2).all()  # two cycles of about 0.4-0.6 s
    # the duty realized, not the one set: about the board's busy share of the late seconds
    realized = gpu.busy_share(since=4.0)
    assert windowed["reading_duty"].mean() == pytest.approx(realized, abs=0.05)
    assert trace[trace["t"] < 0.5]["reading_duty"].isna().all()  # no cycle measured yet
    # and how the pacer idled: once a step, as long a cycle as a step, one point a step
    assert late["pace_cycle_s"].median() == pytest.approx(late["step_s"].median(), rel=0.1)
    assert late["pace_points"].iloc[-1] - late["pace_points"].iloc[0] == pytest.approx(
        late["calls"].sum(), abs=2)


@pytest.mark.parametrize("duty", [0.5, 1.0])
def test_the_hosts_waits_between_drained_steps_are_the_boards_idle(duty):
    """A loader that waits 0.1 s before each 0.2 s step: at duty 0.5 each step ends drained at
    its last pacing point, so the wait is idle of the GPU's, in the duty a window is read at
    (`reading_duty`) and not in the one the pacer realized (`reading_paced_duty`); at full duty
    nothing is drained (a step may still be running when the host waits) and neither counts it."""
    gpu = SimStepGpu(Plant(PROFILES), STEP, blocks=16)
    ctl = sim_controller(gpu, "static", None, configuration="unchanged", duty=duty)
    while gpu.t < 10.0:
        gpu.advance(0.1, None)
        ctl.step(gpu.step_fn(ctl), tokens=gpu.tokens_per_step)
    late = ctl.trace().query("t > 3")
    given = gpu.busy_share(since=3.0)
    if duty < 1.0:
        assert late["reading_duty"].mean() == pytest.approx(given, abs=0.03)
        # (a cycle: 0.2 s of step, 0.2 s slept, 0.1 s waited)
        assert given == pytest.approx(0.4, abs=0.03)
        assert late["reading_paced_duty"].mean() == pytest.approx(given + 0.1 / 0.5, abs=0.03)
    else:
        assert given == pytest.approx(2 / 3, abs=0.03) and ctl._pacer.waited_s == 0.0


def test_a_step_paced_at_its_blocks_idles_in_cycles_of_milliseconds():
    gpu = SimStepGpu(Plant(PROFILES), STEP, blocks=16)
    ctl = sim_controller(gpu, budget_w=300.0)
    late = run_steps(ctl, gpu, 8.0).query("t > 4")
    assert late["step_s"].median() > 0.4  # a 0.2 s step at duty about 0.33
    assert late["pace_cycle_s"].median() < 0.1 * late["step_s"].median()  # (about 40 ms here)
    assert late["pace_points"].iloc[-1] - late["pace_points"].iloc[0] == pytest.approx(16 * late["calls"].sum(), abs=32)


def test_energy_mode_runs_steps_at_full_duty():
    gpu = SimStepGpu(Plant(PROFILES), STEP)
    ctl = sim_controller(gpu, mode="energy", budget_w=None, knobs=KNOBS)
    trace = run_steps(ctl, gpu, 12.0)
    assert (trace["duty"] == 1.0).all() and ctl.slept_s == 0.0
    # x2 draws 570 W for 0.21 s, x1 650 W for 0.2 s a step: x2 is 8% cheaper per token
    assert trace[trace["t"] > 8]["config"].eq("unchanged x2").all()


def test_a_step_inside_a_capture_or_compiled_region_is_paced_between_steps_only():
    gpu = SimStepGpu(Plant(PROFILES), STEP, blocks=8)
    ctl = sim_controller(gpu, budget_w=350.0)
    trace = with_counter(run_steps(ctl, gpu, 20.0, step=between_steps_only(ctl, gpu)))
    assert ctl._pacer.points == ctl.calls  # only the points between steps counted
    assert ctl.slept_s > 0  # and they paced
    late = trace[trace["t"] > 8]
    assert late["duty"].mean() < 0.7
    # no limit cycle: the loop reads the counter's window against the duty realized in it
    # (read against the duty set now, it swung from 0.01 to 0.89 every 2.6 s)
    assert late["duty"].max() - late["duty"].min() < 0.2, late["duty"].describe()
    windows = window_power(trace)
    assert (windows[windows["start"] >= 8]["power_w"] <= 350 * 1.03).mean() >= 0.95


def test_a_step_that_barely_loads_the_board_runs_unpaced():
    """A step whose watts stay within a few of idle (a launch-bound step, a board that does not
    move) leaves nothing above idle in any window: the budget is far away, so the duty climbs
    to full and stays there (it stayed at the power prior's duty for good: 0.14 here, 0.02 for
    two 700 W boards under 400 W, where steps then slept past a collective's timeout)."""
    plant = Plant(PROFILES)
    # its watts are idle's: no window shows any work (a step whose few watts above idle the
    # readings' scatter hides, a board that does not move: the CPU tests' fake NVML)
    light = {"unchanged": StepProfile(0.2, plant.idle_w), "unchanged x2": StepProfile(0.21, plant.idle_w)}
    gpu = SimStepGpu(plant, light, blocks=8)
    ctl = sim_controller(gpu, budget_w=350.0)
    trace = run_steps(ctl, gpu, 12.0, step=between_steps_only(ctl, gpu))
    late = trace[trace["t"] > 4]
    assert late["duty"].min() >= 0.95, late["duty"].describe()
    assert steps_per_s(trace, 4) >= 0.9 / 0.21


@pytest.mark.parametrize("budget", [300.0, 450.0, 600.0])
def test_steps_paced_between_steps_only_use_the_budget(front_between_steps, budget):
    """A 0.2 s step paced only between steps draws 570-650 W for its length, then idles: the
    steady throughput is that of the fastest static point within the budget. Its 1 s windows
    hold one or two busy phases (at 300 W a cycle is 0.65 s), so they scatter by about 45 W
    whatever the controller does: the margin widens for them, and at 300 W about one window
    in seven is still over the budget's 3%."""
    gpu = SimStepGpu(Plant(PROFILES), STEP, blocks=8)
    ctl = sim_controller(gpu, budget_w=budget, knobs=KNOBS)
    trace = with_counter(run_steps(ctl, gpu, 30.0, step=between_steps_only(ctl, gpu)))
    assert ctl._pacer.points == ctl.calls
    windows = window_power(trace)
    steady = windows[windows["start"] >= 10]
    assert (steady["power_w"] <= budget * 1.03).mean() >= 0.8, steady
    assert (steady["power_w"] <= budget * 1.05).all(), steady
    speed = steps_per_s(trace, 10)
    best = best_static(front_between_steps, budget)
    assert speed >= 0.95 * best, (speed, best)


# A longer step whose phases draw differently, as a model's training step does: forward
# blocks lighter, backward blocks heavier (the board's cap clips them), and an optimizer tail
# with no pacing point in it.
PHASED = {"unchanged": StepProfile(0.5, 600.0), "unchanged x2": StepProfile(0.52, 540.0)}
PHASES = [0.7] * 8 + [1.25] * 16
TAIL = 0.15  # of the step's seconds, at 1.1 x its watts


def phased_step(ctl, gpu: SimStepGpu):
    def step(plan):
        profile = PHASED[plan.label]
        for scale in PHASES:
            ctl.pace()
            gpu.advance(profile.seconds * (1 - TAIL) / len(PHASES), profile.watts * scale)
        gpu.advance(profile.seconds * TAIL, profile.watts * 1.1)
        gpu.steps += 1
        return gpu.steps
    return step


@pytest.fixture(scope="module")
def phased_front():
    return [static_point(label, duty, PHASED, step=phased_step, seconds=10.0) for label in PHASED
            for duty in np.arange(1.0, 0.05, -0.05)]


@pytest.mark.parametrize("budget, share, within", [(300.0, 0.8, 0.8), (450.0, 0.9, 0.95), (600.0, 0.95, 0.95)])
def test_a_step_whose_phases_draw_differently_uses_the_budget(phased_front, budget, share, within):
    """Paced inside the step, its payment cycle is short, but a heavy phase read alone is
    over the budget: read tick by tick it was taken for another tenant's watts (50-110 W),
    and the steps made 0.09 and 0.41 of the best static throughput at 300 and 450 W. Read
    over whole steps, against the duty realized in them, no tenant is seen. What is left of
    the gap is the margin: a 1 s window holds a varying share of the heavy phases of a step
    of about 1.2 s, those windows scatter, and the set point keeps 2.5 deviations of them
    under the budget (the margin widens to 6-8% at 300-450 W). At 300 W a cycle is about
    1.7 s: its 1 s windows hold one heavy phase or none and scatter by 10% of the budget
    whatever the loop does, beyond the 8% the margin may take, so 80-85% of them are within
    (with either micro-batch setting alone, before readings were judged in windows' lags too:
    80% and 85%). No reading is ever taken for a tenant's watts: none is there."""
    gpu = SimStepGpu(Plant(PROFILES), PHASED)
    ctl = sim_controller(gpu, budget_w=budget, knobs=KNOBS)
    trace = with_counter(run_steps(ctl, gpu, 40.0, step=phased_step(ctl, gpu)))
    steady = window_power(trace)
    steady = steady[steady["start"] >= 15]
    assert (steady["power_w"] <= budget * 1.03).mean() >= within, steady
    assert not trace["event"].dropna().str.startswith("others' watts").any(), trace["event"].dropna()
    speed = steps_per_s(trace, 15)
    assert speed >= share * best_static(phased_front, budget), (speed, best_static(phased_front, budget))


def test_micro_batches_need_a_step_function_that_takes_the_plan():
    gpu = SimStepGpu(Plant(PROFILES), STEP)
    ctl = sim_controller(gpu, budget_w=450.0, knobs=KNOBS)
    plain = gpu.step_fn(ctl, profile_of=lambda plan: STEP["unchanged"])
    for _ in range(12):
        ctl.step(lambda: plain(None), tokens=8192)
    refused = ctl.refusals()
    assert any("unchanged x2" in key and "takes no plan" in why for key, why in refused.items()), refused
    assert set(ctl.call_counts()) == {"unchanged"}
    seen = []
    ctl.step(lambda plan: seen.append(plan.micro_batches), tokens=8192, name="with a plan")
    assert seen and seen[0] in (1, 2)


def test_a_configuration_that_runs_out_of_memory_is_refused_and_another_takes_over():
    gpu = SimStepGpu(Plant(PROFILES), STEP)
    ctl = sim_controller(gpu, budget_w=500.0, knobs=KNOBS)
    body = gpu.step_fn(ctl)

    def step(plan):
        if plan.micro_batches == 1:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return body(plan)

    trace = run_steps(ctl, gpu, 6.0, step=step)
    assert any("out of memory" in why for why in ctl.refusals().values())
    assert set(ctl.call_counts()) == {"unchanged x2"}
    assert trace["tokens"].sum() > 0


def test_a_step_refuses_what_it_cannot_change_by_name():
    gpu = SimStepGpu(Plant(PROFILES), STEP)
    ctl = sim_controller(gpu, budget_w=450.0, knobs={"recompute": [0, 50]})
    body = gpu.step_fn(ctl, profile_of=lambda plan: STEP["unchanged"])
    for _ in range(6):
        ctl.step(body, tokens=8192)
    assert any("rc50" in key and "no model attached" in why for key, why in ctl.refusals().items())
    with pytest.raises(ControlError, match="tokens=0"):
        ctl.step(body, tokens=0)
    with pytest.raises(ControlError, match="knob recompute: 30"):
        sim_controller(SimStepGpu(Plant(PROFILES), STEP), knobs={"recompute": [30]})


def test_pacing_owes_idle_at_the_duty_in_force_when_it_pays():
    """A cut to the lowest duty just before a pacing point must not hold a long step's idle
    for seconds: the debt is re-read at the duty in force slice by slice."""
    from flashwatt.control.pacing import Pacer

    clock = {"t": 0.0, "duty": 0.01}

    def sleep(seconds):
        clock["t"] += seconds
        clock["duty"] = min(1.0, clock["duty"] + 0.15 * seconds / 0.1)  # the loop climbing back

    pacer = Pacer(DeviceOps(None, lambda: clock["t"]), lambda: clock["duty"], clock=lambda: clock["t"], sleep=sleep)
    pacer.resume()
    clock["t"] += 0.2  # a 0.2 s step
    slept = pacer.point()
    assert 0 < slept < 0.5  # not 0.2 x 0.99 / 0.01 = 19.8 s


def test_a_static_front_records_a_configurations_error_on_one_rank_and_ends_on_a_jobs_fault():
    """One GPU: a point that raises is a row with its reason, and the front goes on. A job's
    fault (another rank stopped answering) is no configuration's: it ends the front. On
    several ranks every error ends it, since a rank that went on to the next point would
    leave its peers waiting at this point's collectives."""
    from flashwatt.control.model_steps import PeerLost
    from flashwatt.control.step_study import front_rows

    def run_static(label, duty):
        if duty == 0.5:
            raise RuntimeError("this backend cannot run the step")
        return {"tokens_per_s": 100.0 * duty, "avg_power_w": 300.0, "steps": 3}, pd.DataFrame({"t": [0.0]})

    rows, traces = front_rows(run_static, ["a"], [1.0, 0.5, 0.3])
    assert [r["duty"] for r in rows] == [1.0, 0.5, 0.3] and "cannot run" in rows[1]["error"] and len(traces) == 2
    with pytest.raises(RuntimeError, match="cannot run"):
        front_rows(run_static, ["a"], [1.0, 0.5, 0.3], ranks=2)

    def peer_lost(label, duty):
        raise PeerLost("rank 1 stopped answering")

    with pytest.raises(PeerLost):
        front_rows(peer_lost, ["a"], [1.0])

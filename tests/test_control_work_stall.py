"""A stall of our own work (flashwatt.control.work_stall) on the simulated GPU of
tests/control_plant.py, with the real Controller running steps in simulated time: the loop
waits 1.3 s on its data in the middle of a run, the board idles, and the work comes back.

Seen on four H200s in a 2400 W run: read as the board's, the stall's fall took the share to
its floor and the margin to 8 %, and when the work came back its watts over the shrunken
table were taken for 250-300 W of another tenant's for the rest of the run."""
from __future__ import annotations

import pandas as pd
import pytest

from control_plant import PROFILES, Plant, SimStepGpu, StepProfile, run_steps, sim_controller
from flashwatt.control.metrics import run_merit, window_power
from test_control_step import STEP, between_steps_only, steps_per_s, with_counter

STALL_AT, STALL_S = 12.0, 1.3
# Steps shorter than a tick: the controller reads the board's instant readings, not the energy
# counter's windows of whole steps.
SHORT = {"unchanged": StepProfile(0.04, 650.0), "unchanged x2": StepProfile(0.042, 570.0)}


def run_with_stall(budget: float, between: bool, where: str = "between steps", seconds: float = 24.0,
                   profiles: dict = STEP, after_stall=None):
    """A governed run whose loop stalls once, after STALL_AT, for STALL_S of idle board:
    between two steps (the loop waits on its data), inside one (its host stalls before it
    launches anything), a slow host (for STALL_S every block of the steps waits five times
    its GPU time for its launches: some work in every tick, at a sixth of its rate), or a slow
    loader (for STALL_S the loop waits five times a step's GPU time before each step).
    `after_stall(gpu, s)`, where given, runs before every step after a stall between steps,
    `s` seconds after it ended: what the work does as it comes back."""
    gpu = SimStepGpu(Plant(PROFILES), profiles, blocks=8 if between else 16)
    ctl = sim_controller(gpu, budget_w=budget)
    body = between_steps_only(ctl, gpu) if between else gpu.step_fn(ctl)
    done = {"stalled": False}

    def stall_due() -> bool:
        due = gpu.t >= STALL_AT and not done["stalled"]
        done["stalled"] |= due
        return due

    slow_until = {"t": -1.0}

    def step(plan):
        if where == "inside a step" and stall_due():
            gpu.advance(STALL_S, None)
        if where == "a slow host" and stall_due():
            slow_until["t"] = gpu.t + STALL_S
        if where == "a slow host" and gpu.t < slow_until["t"]:  # each block waits on the host five times its GPU time
            profile = gpu.profiles[plan.label]
            for _ in range(gpu.blocks):
                ctl.pace()
                gpu.advance(5 * profile.seconds / gpu.blocks, None)
                gpu.advance(profile.seconds / gpu.blocks, profile.watts)
            gpu.steps += 1
            return gpu.steps
        return body(plan)
    ended = None
    while gpu.t < seconds:
        if where == "between steps" and stall_due():
            gpu.advance(STALL_S, None)
            ended = gpu.t
        if after_stall is not None and ended is not None:
            after_stall(gpu, gpu.t - ended)
        if where == "a slow loader" and stall_due():
            slow_until["t"] = gpu.t + STALL_S
        if where == "a slow loader" and gpu.t < slow_until["t"]:
            gpu.advance(5 * gpu.profiles["unchanged"].seconds, None)
        ctl.step(step, tokens=gpu.tokens_per_step)
    trace = pd.merge_asof(ctl.trace().sort_values("t"), pd.DataFrame(gpu.rows), on="t", direction="nearest")
    return with_counter(trace), ctl


@pytest.mark.parametrize("where", ["between steps", "inside a step", "a slow host", "a slow loader"])
@pytest.mark.parametrize("between, profiles", [(False, STEP), (True, STEP), (False, SHORT)],
                         ids=["paced inside steps", "paced between steps", "steps shorter than a tick"])
@pytest.mark.parametrize("budget", [450.0, 600.0])
def test_a_stall_of_our_work_teaches_nothing_of_the_board(budget, between, profiles, where):
    trace, ctl = run_with_stall(budget, between, where, profiles=profiles)
    events = trace["event"].fillna("")
    assert events.str.contains("our work stopped").sum() == 1, events[events != ""]
    assert run_merit(trace)["stalls"] == 1  # and the run's figures say so
    assert events.str.contains("our work back").sum() == 1, events[events != ""]
    back = trace.loc[events.str.contains("our work back").idxmax(), "t"]
    # (a stall inside steps lengthens the step the credit and the pacing expect for a while:
    # the readings stay hidden longer, but only those under the table's watts)
    assert back <= STALL_AT + STALL_S + (2.0 if where == "between steps" else 4.0), back
    after = trace[trace["t"] >= back]
    # nothing of the fall went into the others' watts, the share or the margin
    assert trace["offset_w"].max() <= 5.0, trace["offset_w"].max()
    assert after["table_share"].between(0.95, 1.05).all(), after["table_share"].describe()
    # (a step paced between steps only widens the margin for its windows' scatter anyway)
    was = trace[(trace["t"] > STALL_AT - 3.0) & (trace["t"] < STALL_AT)]["margin"].max()
    assert after["margin"].max() <= max(was, ctl.governor.base_margin) + 0.01, (after["margin"].max(), was)
    # so the run goes on as before it: the same throughput, every window within the budget
    before = steps_per_s(trace[trace["t"] < STALL_AT], 6.0)
    assert steps_per_s(trace, back + 1.0) >= 0.97 * before, (steps_per_s(trace, back + 1.0), before)
    windows = window_power(trace)
    assert (windows[windows["start"] >= 6.0]["power_w"] <= budget * 1.03).mean() >= (0.95 if not between else 0.8)


def test_a_tenant_that_slows_our_steps_is_still_answered():
    """Our steps run four times slower (another process takes most of the GPU's time) while the
    board draws 200 W more than ours: the work fell as in a stall, but the readings rose, so
    nothing is hidden and the budget holds. Hiding them as a stall's would leave the board
    200 W over."""
    budget, seconds = 600.0, 20.0
    gpu = SimStepGpu(Plant(PROFILES), STEP)
    ctl = sim_controller(gpu, budget_w=budget)
    slow = {"on": False}

    def step(plan):
        profile = STEP[plan.label]
        for _ in range(gpu.blocks):
            ctl.pace()
            if slow["on"]:
                gpu.advance(4 * profile.seconds / gpu.blocks, profile.watts + 200.0)
            else:
                gpu.advance(profile.seconds / gpu.blocks, profile.watts)
        gpu.steps += 1
        slow["on"] = gpu.t >= 10.0
        return gpu.steps
    trace = with_counter(run_steps(ctl, gpu, seconds, step=step))
    assert not trace["event"].fillna("").str.contains("our work stopped").any()
    windows = window_power(trace)
    late = windows[windows["start"] >= 12.0]
    assert (late["power_w"] <= budget * 1.03).all(), late


def test_attention_calls_are_not_watched():
    """Attention calls are often a part of a larger step the controller does not see: a tick
    without them is no stall, and only a step (Controller.step) turns the watch on."""
    gpu = SimStepGpu(Plant(PROFILES), STEP)
    ctl = sim_controller(gpu, budget_w=450.0)
    assert ctl.governor.watch_stalls is False
    run_steps(ctl, gpu, 1.0)
    assert ctl.governor.watch_stalls is True


def test_work_that_comes_back_slower_after_a_stall_is_read_at_the_duty_it_was_given():
    """After a 1.3 s stall the loader waits half a step's GPU time before each step for 2.5 s:
    the work is back at two thirds of its rate, above the share that ends a stall, and the
    board draws under what the pacer's duty would. The host's waits after a drained step are
    the GPU's idle in the duty a window is read at, so the board agrees with its table: the
    share holds and no tenant is seen when the loader is quick again. (Read at the pacer's duty,
    the share went to its floor and then 90 W were taken for another tenant's; a two-H200 run at
    1200 W showed the same.) The stall itself is still told, at the duty the pacer set."""
    budget = 450.0

    def slow_loader(gpu: SimStepGpu, since: float) -> None:
        if since < 2.5:
            gpu.advance(0.5 * gpu.profiles["unchanged"].seconds, None)
    trace, _ = run_with_stall(budget, False, seconds=22.0, after_stall=slow_loader)
    events = trace["event"].fillna("")
    assert events.str.contains("our work stopped").sum() == 1, events[events != ""]
    assert trace["offset_w"].max() <= 5.0, trace[["t", "offset_w", "event"]][trace["offset_w"] > 5.0]
    after = trace[trace["t"] >= STALL_AT + STALL_S]
    assert after["table_share"].between(0.95, 1.05).all(), after["table_share"].describe()
    slow = trace[(trace["t"] > STALL_AT + STALL_S + 1.0) & (trace["t"] < STALL_AT + STALL_S + 2.5)]
    assert (slow["reading_duty"] < slow["duty"] - 0.05).all()  # read at the duty the GPU was given
    windows = window_power(trace)
    assert (windows[windows["start"] >= 6.0]["power_w"] <= budget * 1.03).all(), windows


def test_work_that_comes_back_drawing_more_after_a_stall_is_cut_while_its_readings_are_held():
    """After a 1.3 s stall the work comes back drawing a tenth more for 2.5 s, as boards cooled
    by the idle do: four H200s drew 2.55-2.67 kW at full duty after a stall, 2.35-2.45 kW
    before it, under a 2.4 kW budget. A reading over a window holding the stall teaches nothing
    and the duty holds, but its watts are a floor of ours at that duty (the stall's idle pulls
    them down): over the budget, they cut. (Held, four H200s' windows stayed 5-10 % over the
    budget for 1.2 s.)"""
    budget = 600.0

    def cooled_boards(gpu: SimStepGpu, since: float) -> None:
        gpu.watts_scale = 1.1 if since < 2.5 else 1.0
    trace, _ = run_with_stall(budget, False, seconds=22.0, after_stall=cooled_boards)
    events = trace["event"].fillna("")
    assert events.str.contains("our work stopped").sum() == 1, events[events != ""]
    windows = window_power(trace)
    assert (windows[windows["start"] >= 6.0]["power_w"] <= budget * 1.03).all(), windows


@pytest.mark.parametrize("hiccup_s, sensor_ticks", [(0.2, True), (0.3, False)])
def test_a_hiccup_inside_a_step_moves_neither_the_share_nor_the_others_watts(hiccup_s, sensor_ticks):
    """The host stops for 0.2-0.3 s in the middle of a step near full duty (garbage collection,
    a rank waiting on a peer; the sensor's thread stopped with it or not): too short to be
    told as a stall, and counted busy, so one reading falls far under the table with no
    others' watts on the board to leave. A share does not fall like that in a tick: it holds,
    and no tenant is taken when the work goes on. (Taken into the share, the fall took it to
    its floor, 0.85, in one reading, the duty to full and 64-95 W for another tenant's; on two
    H200s a 0.3 s hiccup took the share from 1.01 to 0.85 and the return 160 W over budget.)"""
    budget = 600.0
    gpu = SimStepGpu(Plant(PROFILES), STEP, blocks=16)
    ctl = sim_controller(gpu, budget_w=budget)
    state = {"done": False}

    def step(plan):
        profile = gpu.profiles[plan.label]
        for k in range(gpu.blocks):
            ctl.pace()
            if k == 8 and not state["done"] and gpu.t >= STALL_AT:
                state["done"], tick = True, gpu.on_tick
                gpu.on_tick = tick if sensor_ticks else None
                gpu.advance(hiccup_s, None)
                gpu.on_tick = tick
            gpu.advance(profile.seconds / gpu.blocks, profile.watts)
        gpu.steps += 1
        return gpu.steps
    trace = with_counter(run_steps(ctl, gpu, 20.0, step=step))
    after = trace[trace["t"] > STALL_AT - 1.0]
    assert after["table_share"].min() >= 0.95, after[["t", "table_share", "duty", "event"]]
    assert trace["offset_w"].max() <= 5.0, trace[["t", "offset_w", "event"]][trace["offset_w"] > 5.0]
    windows = window_power(trace)
    assert (windows[windows["start"] >= 6.0]["power_w"] <= budget * 1.03).all(), windows

"""Pacing: idle time on the GPU, made by the host between launches, at the duty the governor
sets. The one mechanism behind attention calls and model steps.

The host owes `busy x (1 - duty) / duty` seconds of idle time for every `busy` second of
GPU work; once that is worth a sleep (`quantum_s`) it waits for the GPU's queue to drain
and sleeps, so the GPU really idles. Two ways of counting the busy time:

- `after_call(gpu_s, duty)`, for attention calls (each a fraction of a millisecond to a few
  milliseconds): the GPU time of the call as the online model knows it; the queue is kept
  to at most `max_in_flight_s` of work (a stamp per ~1 ms of work, the oldest waited on
  past the bound), so a new duty acts within milliseconds. The debt is paid each `quantum_s`
  of idle it owes, or, given `target_cycle_s`, once a cycle of it is owed
  (`target_cycle_s x (1 - duty)` of idle, at least `quantum_s`): a board idle for tens of
  milliseconds at a time draws less than one idle 2 ms at a time (on an H200 at duty 0.7,
  555 W against 656 W for the same tokens with 100 ms idles), but the loop as tuned holds
  budgets worse on such cycles (docs/control.md, "Pacing cycles"), so it is opt-in.
- `point(duty)`, for steps (tens of milliseconds to seconds): at a pacing point (between
  steps, and within a step where the model's blocks begin, forward and backward) the queue
  is drained and the time since the GPU last resumed is the busy time.

On several ranks of one job (`agree`, flashwatt.control.job_power), every rank idles at the
same pacing points for as long: the smallest idle any rank owes there. A rank's busy time
counts the time it waited at a collective for a peer that was idling; paid back on its own,
that wait became (1 - d) / d times as much idle, which its peer then waited out in turn:
below duty 0.5 the idle grew point after point (on two H100s until the NCCL watchdog ended
the job). Paid together, nobody waits on another's idle, and the rank that waited least sets it.

A pacing point does nothing inside a CUDA graph being captured or a region torch.compile is
tracing (`DeviceOps.capturing`): pacing is a host-side sleep between launches, never part of
a captured graph, so a compiled or graphed step is paced between steps only. Nothing here
touches a device setting.
"""
from __future__ import annotations

import collections
import time
from typing import Any, Callable

from flashwatt.control.duty_mix import DutyMix


class DeviceOps:
    """The device queue as pacing and timing need it: drain it, stamp a point in it, ask
    whether a stamp has passed, the seconds between two stamps. CUDA events on a GPU; the
    host's clock elsewhere (the CPU, the simulated GPU of the tests), where work is done
    when it is issued."""

    def __init__(self, device: Any = None, clock: Callable[[], float] = time.perf_counter):
        self.cuda = getattr(device, "type", None) == "cuda"
        self.device = device
        self.clock = clock

    def sync(self) -> None:
        if self.cuda:
            import torch

            torch.cuda.current_stream(self.device).synchronize()

    def stamp(self, timing: bool = True) -> Any:
        if not self.cuda:
            return self.clock()
        import torch

        event = torch.cuda.Event(enable_timing=timing)
        event.record()
        return event

    def done(self, stamp: Any) -> bool:
        return stamp.query() if self.cuda else True

    def wait(self, stamp: Any) -> None:
        if self.cuda:
            stamp.synchronize()

    def seconds(self, start: Any, end: Any) -> float:
        return start.elapsed_time(end) / 1e3 if self.cuda else end - start

    @staticmethod
    def capturing() -> bool:
        """Inside a CUDA graph capture or a torch.compile trace: no host-side sleep belongs there."""
        import torch

        compiling = getattr(getattr(torch, "compiler", None), "is_compiling", lambda: False)
        if compiling():
            return True
        return bool(torch.cuda.is_available() and torch.cuda.is_current_stream_capturing())


# The pacing cycle of attention calls (module docstring): 0 pays each quantum; a quarter second
# fits four cycles to a 1 s window (`Controller(pace_cycle_s=0.25)`).
CALL_CYCLE_S = 0.0

# Idle time is paid in slices of at most this long, the debt re-read at the duty in force
# before each: a duty that rose meanwhile (the governor decides ten times a second) owes less.
MAX_SLICE_S = 0.05


def idle_ratio(duty: float) -> float:
    """Idle seconds owed per busy second at `duty`."""
    return (1.0 - duty) / duty if duty < 1.0 else 0.0


class Pacer:
    """Owes and pays idle time (module docstring). The debt is kept in busy seconds not yet
    paid for, and turned into idle time at the duty in force when it is paid (`duty()`): a
    step's busy time owes what the duty says when the step reaches a pacing point, and a
    duty that moves during the payment (a cut, then the loop's climb back) moves the rest of
    it, so a momentary cut to the lowest duty cannot hold a long step's idle for seconds."""

    def __init__(self, ops: DeviceOps, duty: Callable[[], float], quantum_s: float = 0.002,
                 max_in_flight_s: float = 0.02, clock: Callable[[], float] = time.perf_counter,
                 sleep: Callable[[float], None] = time.sleep, capturing: Callable[[], bool] | None = None,
                 target_cycle_s: float = 0.0):
        self.ops = ops
        self.duty = duty
        self.quantum_s = quantum_s
        self.target_cycle_s = target_cycle_s  # attention calls: the pacing cycle paid in one go (0: each quantum)
        self.max_in_flight_s = max_in_flight_s
        # A duty that time-shares full duty with a lower one (flashwatt.control.duty_mix): at full
        # duty a step's pacing point waits for the one before it, so the host runs at most one
        # segment ahead of the GPU, and idle owed in a low phase is carried to the next one
        self.mix = duty if isinstance(duty, DutyMix) else None
        self._lead_stamp: Any = None
        self._queued_at_full = False  # calls in a mix: the last was issued in a full phase (its queue not owed for)
        self._full_point_t: float | None = None  # steps: the last pacing point passed at full duty
        self.clock = clock
        self.sleep = sleep
        self.capturing = capturing if capturing is not None else ops.capturing
        self.slept_s = 0.0  # idle time paid so far (whole slices)
        self._sleeping: tuple[float, float] | None = None  # (start, slept_s then) of the slice being slept
        self.points = 0  # pacing points reached (steps)
        self.cycle_s = 0.0  # a step's pacing cycle: seconds between the starts of two payments (averaged)
        self.step_s = 0.0  # seconds between the starts of two steps, their idle included (averaged)
        self._step_t: float | None = None
        self._last_pay_t: float | None = None
        self._owed_busy_s = 0.0
        self._in_flight: collections.deque = collections.deque()  # (stamp, estimated GPU seconds)
        self._unmarked_s = 0.0
        self._resumed_t: float | None = None
        # On a job's ranks: the idle this rank owes at a pacing point -> the idle every rank
        # pays there (the smallest owed), called at every point on every rank alike.
        self.agree: Callable[[float], float] | None = None
        # The host's own waits between steps (step_ended): the GPU idle, the pacer not sleeping
        self.waited_s = 0.0
        self._drained_t: float | None = None
        self._point_drained = False

    def idle_s(self) -> float:
        """Idle time paid so far, the slice being slept included up to now: what a sensor's
        tick, which may come in the middle of a sleep, needs to know the duty the board ran at
        over a window (flashwatt.control.counter_power)."""
        sleeping = self._sleeping  # one read: the sleeping thread replaces it whole
        if sleeping is None:
            return self.slept_s
        start, before = sleeping
        return before + max(0.0, self.clock() - start)

    def waited_s_now(self) -> float:
        """The host's own waits between steps so far (step_ended), the one going on included:
        the GPU idle without the pacer sleeping."""
        waiting = self._drained_t  # (one read: another thread replaces it whole)
        return self.waited_s + (max(0.0, self.clock() - waiting) if waiting is not None else 0.0)

    def _owed_idle_s(self) -> float:
        return self._owed_busy_s * idle_ratio(self.duty())

    # ---- attention calls -----------------------------------------------------------------
    def after_call(self, gpu_s: float) -> None:
        """One call of `gpu_s` GPU seconds was issued: bound the queue, pay what is owed."""
        self._unmarked_s += gpu_s
        if self._unmarked_s >= 1e-3:
            self._in_flight.append((self.ops.stamp(timing=False), self._unmarked_s))
            self._unmarked_s = 0.0
            queued = sum(s for _, s in self._in_flight)
            while queued > self.max_in_flight_s and len(self._in_flight) > 1:
                stamp, s = self._in_flight.popleft()
                self.ops.wait(stamp)
                queued -= s
        duty = self.duty()
        if duty >= 1.0:
            self._queued_at_full = self.mix is not None
            if self.target_cycle_s:  # no cycle runs: the next payment starts one afresh
                self._last_pay_t, self.cycle_s = None, 0.0
        elif gpu_s:
            if self._queued_at_full:  # the queue issued at full duty runs now, at this duty
                self._queued_at_full = False
                while self._in_flight and self.ops.done(self._in_flight[0][0]):
                    self._in_flight.popleft()
                backlog = max(0.0, sum(s for _, s in self._in_flight) + self._unmarked_s - gpu_s)
                self._owed_busy_s += self._ran_in_low_phase(self.clock() + backlog, backlog)
            self._owed_busy_s += gpu_s
            if self._owed_idle_s() >= max(self.quantum_s, self.target_cycle_s * (1.0 - duty)):
                self.ops.sync()
                self._in_flight.clear()
                self._unmarked_s = 0.0
                if self.target_cycle_s:  # cycles the controller reads through the energy counter
                    if self._last_pay_t is None:  # a first cycle: as long as it is meant to be until measured
                        self.cycle_s = self.target_cycle_s
                    self._mark_payment()
                self._pay()

    # ---- steps -----------------------------------------------------------------------------
    def step_ended(self) -> None:
        """A step ended at the point just passed. Where that point drained the queue, the GPU
        idles from now until the next step starts: time the host spends on its own (a loader,
        logging), idle that the pacer did not sleep but the board rests in all the same."""
        self._drained_t = self.clock() if self._point_drained else None

    def resume(self) -> None:
        """The GPU is busy from now (a step starts)."""
        self._resumed_t = now = self.clock()
        waiting, self._drained_t = self._drained_t, None
        if waiting is not None:
            self.waited_s += max(0.0, now - waiting)
        if self._step_t is not None:
            self.step_s += 0.3 * ((now - self._step_t) - self.step_s)
        self._step_t = now

    def point(self, drained: Callable[[], None] | None = None) -> float:
        """A pacing point of a step: the seconds slept here (0 at full duty, inside a capture or
        a compiled region, or while less than `quantum_s` is owed). `drained` is called once
        the queue is empty, before the sleep (at full duty: at once, nothing is waited for)."""
        if self.capturing():  # first, and nothing else: a compiler tracing this sees no side effect
            return 0.0
        self.points += 1
        self._point_drained = False
        if self.agree is not None:
            return self._point_together(drained)
        if self.duty() >= 1.0:
            self._at_full_duty()
            if self.mix is not None:
                stamp, self._lead_stamp = self._lead_stamp, self.ops.stamp(timing=False)
                if stamp is not None:
                    self.ops.wait(stamp)
            if drained is not None:
                drained()
            return 0.0
        self._lead_stamp = None
        t0 = self.clock()
        self.ops.sync()
        self._point_drained = True
        if drained is not None:
            drained()
        self._count_busy()
        full_t, self._full_point_t = self._full_point_t, None
        if full_t is not None:  # the first point since full duty: the queue it drained
            now = self.clock()
            self._owed_busy_s += self._ran_in_low_phase(now, now - t0, full_t)
        slept = 0.0
        if self._owed_idle_s() >= self.quantum_s:
            self._mark_payment()
            slept = self._pay()
        self._resumed_t = self.clock()
        return slept

    def _point_together(self, drained: Callable[[], None] | None) -> float:
        """A pacing point on one of a job's ranks (module docstring): what this rank owes, then
        the idle all pay, the same on every rank. A rank at full duty owes nothing, so while
        the duty passes 1 on its way to the ranks nobody idles."""
        duty = self.duty()
        owed = 0.0
        if duty >= 1.0:
            self._at_full_duty()
        else:
            self.ops.sync()
            self._point_drained = True
            self._count_busy()
            owed = self._owed_busy_s * idle_ratio(duty)
        if drained is not None:
            drained()
        common = self.agree(owed)
        slept = 0.0
        if common >= self.quantum_s:
            self._mark_payment()
            slept = self._sleep_for(common)
            self._owed_busy_s = max(0.0, self._owed_busy_s - slept / idle_ratio(duty))
        if duty < 1.0:
            self._resumed_t = self.clock()
        return slept

    def _at_full_duty(self) -> None:
        """Nothing is owed at full duty, and no pacing cycle runs."""
        self._resumed_t = self._last_pay_t = None
        self.cycle_s = 0.0
        if self.mix is None or self.mix.duty() >= 1.0:
            self._owed_busy_s = 0.0
        else:  # a mix's full phase: the low phase's debt waits for the next one, no more than it pays
            self._owed_busy_s = min(self._owed_busy_s, self.mix.low * self.mix.period_s)
        self._full_point_t = self.clock()

    def _ran_in_low_phase(self, drained_t: float, backlog_s: float, since: float = float("-inf")) -> float:
        """A mix's low phase found `backlog_s` of work queued at full duty, run until
        `drained_t`: the mix learns the lag, and what of it ran in the low phase (on the GPU,
        from its start or `since`, if later) is owed for there. Outside a mix: nothing."""
        start = self.mix.low_since() if self.mix is not None else None
        if start is None:
            return 0.0
        self.mix.drained(backlog_s)
        return max(0.0, drained_t - max(start, since))

    def _count_busy(self) -> None:
        """The GPU's busy time since it last resumed (the queue drained) is owed idle."""
        if self._resumed_t is not None:
            self._owed_busy_s += max(0.0, self.clock() - self._resumed_t)

    def _mark_payment(self) -> None:
        """A payment starts now: the pacing cycle is the time since the last one."""
        now = self.clock()
        if self._last_pay_t is not None:
            self.cycle_s += 0.3 * ((now - self._last_pay_t) - self.cycle_s)
        self._last_pay_t = now

    def _pay(self) -> float:
        """Sleep off the debt, slice by slice, at the duty in force before each slice."""
        slept = 0.0
        while True:
            ratio = idle_ratio(self.duty())
            owed = self._owed_busy_s * ratio
            if ratio <= 0.0 or owed < min(self.quantum_s, 1e-4) or owed <= 0.0:
                if ratio <= 0.0 and (self.mix is None or self.mix.duty() >= 1.0):
                    self._owed_busy_s = 0.0
                break
            took = self._sleep_slice(owed)
            slept += took
            self._owed_busy_s -= took / ratio  # a sleep that overran paid ahead
        return slept

    def _sleep_for(self, seconds: float) -> float:
        """Idle exactly `seconds` (the idle a job's ranks agreed on), slice by slice."""
        slept = 0.0
        while seconds - slept > 1e-4:
            slept += self._sleep_slice(seconds - slept)
        return slept

    def _sleep_slice(self, seconds: float) -> float:
        """One sleep of at most MAX_SLICE_S, visible to the sensor while it lasts, and not past
        the end of a mix's low phase (flashwatt.control.duty_mix); its length."""
        t0 = self.clock()
        end = self.mix.phase_ends() if self.mix is not None else None
        if end is not None and end - t0 > 1e-4:
            seconds = min(seconds, end - t0)
        self._sleeping = (t0, self.slept_s)
        self.sleep(min(seconds, MAX_SLICE_S))
        took = self.clock() - t0
        self.slept_s += took
        self._sleeping = None
        return took

"""A training run under the step-level controller (a cell's `governor`: a budget, a
schedule, energy mode, a temperature limit alongside a budget; flashwatt.control).

Every training step is a controller step (flashwatt.control.model_steps): paced between and
within steps (pacing points where the model's blocks begin), split into the micro-batches
its plan says where the knobs allow; evaluations are paced as well and change nothing
(the budget holds through them). The knobs are the suite's `training.governor.knobs`; by
default the run keeps its own backend and only pacing moves. A schedule's budget follows
the seconds since the run began. When the run ends, the controller's ticks join the
cell's trace (`source` "controller") and the record's `control` holds the run judged
against its budget: 1 s windows from the energy counter as a meter of its own reads it
(flashwatt.control.counter_meter), the worst overshoot, settling, and the temperature
limit's windows where one was held.
"""
from __future__ import annotations

import time

from flashwatt.control.counter_meter import judged_by_meter, meter_for, meter_merit
from flashwatt.control.governor_setting import GovernorSetting
from flashwatt.training.cell import TrainCell

DEFAULT_KNOBS = {"backend": ["unchanged"]}


class GovernedRun:
    """The controller of one training run, from its start to its end."""

    def __init__(self, cell: TrainCell, spec: dict, model, device, telemetry):
        from flashwatt.control import Controller

        self.setting = GovernorSetting.parse(cell.governor)
        settings = spec.get("governor") or {}
        self.knobs = {**DEFAULT_KNOBS, **settings.get("knobs", {})}
        self.schedule = self.setting.budget()
        self.controller = Controller(self.setting.controller_mode, self.schedule.first_w if self.schedule else None,
                                     device, telemetry=telemetry, knobs=self.knobs,
                                     temp_limit_c=self.setting.temp_limit_c)
        self.controller.attach(model, precision=cell.precision, train=True)
        self._timeline = self.schedule.timeline() if self.schedule is not None else []
        # the judge's own reader of the board's energy counter (flashwatt.control.counter_meter)
        self.meter = meter_for(telemetry)
        self.t0 = time.monotonic()

    def before_step(self) -> None:
        """The schedule's budget at the seconds since the run began."""
        now = time.monotonic() - self.t0
        while self._timeline and now >= self._timeline[0][0]:
            self.controller.set_budget(self._timeline.pop(0)[1])

    def close(self, tokens: int) -> tuple[dict, list[dict]]:
        """Stop the controller; (the record's `control`, its ticks for the trace)."""
        from flashwatt.control.metrics import run_merit
        from flashwatt.control.thermal_merit import temperature_merit

        wall = time.monotonic() - self.t0
        self.controller.close()
        if self.meter is not None:
            self.meter.stop(after=time.monotonic())  # (on past the last tick: the last window is judged too)
        trace = self.controller.trace()
        if len(trace):
            trace["t"] = trace["t"] - self.t0
            trace = trace[trace["t"] >= 0].reset_index(drop=True)
        trace = judged_by_meter(trace, self.meter, self.t0)
        merit = run_merit(trace, tokens=tokens, wall_s=wall)
        merit.update(temperature_merit(trace))
        if self.meter is not None:
            merit.update(meter_merit(self.meter))
        ctl = self.controller
        control = {"setting": self.setting.token, "mode": self.setting.mode,
                   "schedule": self.schedule.as_lists() if self.schedule is not None else None,
                   "temp_limit_c": self.setting.temp_limit_c, "knobs": self.knobs, "merit": merit,
                   "choices": ctl.choices(), "refusals": ctl.refusals(), "calls": ctl.call_counts(),
                   "slept_s": ctl.slept_s, "idle_w": ctl.idle_w, "limit_w": ctl.limit_w,
                   "warm_start": ctl.warm_start(), "fault": ctl.fault()}
        return control, trace.assign(source="controller").to_dict("records")

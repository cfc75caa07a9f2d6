"""How far one power reading strays from what the board draws: the noise the feedback must
not answer, learned from the readings themselves.

NVML's instant reading scatters about the power a duty draws by a share of the watts above
idle, white from one reading to the next: on an H100 80GB HBM3 10-12% of them at every
paced level of the steady shape (18 W at 150 W above idle, 49 W at 450 W), 19% on a mix of
shapes, and +-42 W at full duty under the limiter (docs/control.md; tests/control_plant.py
holds the fit). A reading that far over the set point is noise, not a reason to cut; a
tenant's arrival is a step several times larger.

The share is learned from pairs of readings taken while the duty held still (their
difference has twice the variance of one reading's noise), each difference clipped at
REJECT_SIGMAS of the estimate so that a step of load teaches little; it starts at
PRIOR_SHARE, or MIX_PRIOR_SHARE for a mix of shapes (the governor keeps one of each).

The pair is `lag` readings apart: consecutive ones for NVML's instant readings, whose noise
is white, but as many as a reading's window spans where each reading averages a window
longer than a tick (a step's power from the energy counter over its pacing cycles,
flashwatt.control.counter_power). Two windows that overlap share most of their error, so
consecutive ones differ by a fraction of it: on four H100s running a training step under one
budget, 1 s windows read every 0.1 s differed by 2-4% of the watts above idle from one
reading to the next and by 8-13% ten readings apart. Learned from consecutive pairs, the
noise came out at a third of that, and the feedback took the readings' wander for other
tenants' watts on half of its ticks, swinging the duty from 0.18 to 0.36 at one budget.
"""
from __future__ import annotations

import math

PRIOR_SHARE = 0.10
MIX_PRIOR_SHARE = 0.18
# Weight of one new pair of readings: the estimate rises faster than it falls (a mix of shapes
# whose readings scatter more, a tenant's bursts), so the feedback is not caught answering noise.
ALPHA_UP = 0.1
ALPHA_DOWN = 0.05
REJECT_SIGMAS = 3.0
FLOOR_W = 3.0  # the noise of a reading at idle
SHARE_RANGE = (0.02, 0.40)
MIN_ABOVE_W = 20.0  # the noise of readings this close to idle is read as at this many watts above
MAX_LAG = 20  # readings a pair may be apart (2 s of 0.1 s ticks; windows are at most 1 s)
# Over a pair `lag` readings apart the duty may have crept: at most this far (it moves the power)
STILL_SPAN = 0.05


class ReadingNoise:
    def __init__(self, idle_w: float | None, share: float = PRIOR_SHARE):
        self.idle_w = idle_w
        self.share = share
        self._history: list[tuple[float, float]] = []  # (reading, duty) of the readings since the duty last moved

    def sigma_w(self, power_w: float | None) -> float:
        """The standard deviation of one reading's noise at this level of power."""
        if power_w is None or self.idle_w is None:
            return FLOOR_W
        return max(FLOOR_W, self.share * max(0.0, power_w - self.idle_w))

    def add(self, reading_w: float, level_w: float, still: bool, lag: int = 1, duty: float | None = None) -> None:
        """A reading; `level_w` what the board is believed to draw, `still` whether the duty
        held still since the reading before (else the difference holds a move of ours);
        `lag` how many readings apart a pair's errors are independent (the readings a
        reading's window spans; module docstring); `duty` the duty it ran at, which may
        creep by at most STILL_SPAN over a pair."""
        duty = 0.0 if duty is None else duty
        self._history = [*self._history[-MAX_LAG:], (reading_w, duty)] if still else [(reading_w, duty)]
        lag = max(1, min(MAX_LAG, lag))
        if len(self._history) <= lag or self.idle_w is None:
            return
        previous, previous_duty = self._history[-1 - lag]
        if abs(duty - previous_duty) > STILL_SPAN:
            return
        above = max(MIN_ABOVE_W, level_w - self.idle_w)
        limit = REJECT_SIGMAS * math.sqrt(2.0) * self.share
        ratio = min(abs(reading_w - previous) / above, limit)
        target = ratio ** 2 / 2.0
        variance = self.share ** 2 + (ALPHA_UP if target > self.share ** 2 else ALPHA_DOWN) * (target - self.share ** 2)
        self.share = min(SHARE_RANGE[1], max(SHARE_RANGE[0], math.sqrt(max(0.0, variance))))

    def forget_previous(self) -> None:
        """No reading came (NVML failed): the next one has no partner."""
        self._history = []

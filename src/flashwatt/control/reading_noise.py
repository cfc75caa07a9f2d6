"""How far one power reading strays from what the board draws: the noise the feedback must
not answer, learned from the readings themselves.

NVML's instant reading scatters about the power a duty draws by a share of the watts above
idle, white from one reading to the next: on an H100 80GB HBM3 10-12% of them at every
paced level of the steady shape (18 W at 150 W above idle, 49 W at 450 W), 19% on a mix of
shapes, and +-42 W at full duty under the limiter (docs/control.md; tests/control_plant.py
holds the fit). A reading that far over the set point is noise, not a reason to cut; a
tenant's arrival is a step several times larger.

The share is learned from pairs of consecutive readings taken while the duty held still
(their difference has twice the variance of one reading's noise), each difference clipped
at REJECT_SIGMAS of the estimate so that a step of load teaches little; it starts at
PRIOR_SHARE, or MIX_PRIOR_SHARE for a mix of shapes (the governor keeps one of each).
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


class ReadingNoise:
    def __init__(self, idle_w: float | None, share: float = PRIOR_SHARE):
        self.idle_w = idle_w
        self.share = share
        self._previous: float | None = None

    def sigma_w(self, power_w: float | None) -> float:
        """The standard deviation of one reading's noise at this level of power."""
        if power_w is None or self.idle_w is None:
            return FLOOR_W
        return max(FLOOR_W, self.share * max(0.0, power_w - self.idle_w))

    def add(self, reading_w: float, level_w: float, still: bool) -> None:
        """A reading; `level_w` what the board is believed to draw, `still` whether the duty
        held still since the reading before (else the difference holds a move of ours)."""
        previous, self._previous = self._previous, reading_w
        if previous is None or not still or self.idle_w is None:
            return
        above = max(MIN_ABOVE_W, level_w - self.idle_w)
        limit = REJECT_SIGMAS * math.sqrt(2.0) * self.share
        ratio = min(abs(reading_w - previous) / above, limit)
        target = ratio ** 2 / 2.0
        variance = self.share ** 2 + (ALPHA_UP if target > self.share ** 2 else ALPHA_DOWN) * (target - self.share ** 2)
        self.share = min(SHARE_RANGE[1], max(SHARE_RANGE[0], math.sqrt(max(0.0, variance))))

    def forget_previous(self) -> None:
        """No reading came (NVML failed): the next one has no partner."""
        self._previous = None

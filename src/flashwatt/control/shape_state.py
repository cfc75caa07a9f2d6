"""Where the controller stands with one call shape: which configuration runs it, which it has
chosen, and what it still has to try.

A shape goes through phases (flashwatt.control.governor drives them):

    probe    each candidate runs a few calls, timed with CUDA events: its GPU time per call.
             A call takes milliseconds, so the probe takes a few hundredths of a second.
    explore  the candidates that are not ruled out by their GPU time, fastest first, each
             until its power is seen at a comparable operating point (or it is clearly worse
             than one explored before); each starts at a duty whose predicted power is within
             the set point (flashwatt.control.power_bound), or is deferred.
    exploit  the shape runs its choice; the choice changes for a predicted gain, after a dwell.
    recheck  from time to time the runner-up runs again for a short dwell, so a ranking made
             from a second of noisy readings (or from a warm start's older ones) is corrected.

A warm-started shape (flashwatt.control.warm_start) begins in `exploit`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from flashwatt.control.configuration import Configuration

PROBE, EXPLORE, EXPLOIT, RECHECK = "probe", "explore", "exploit", "recheck"
# Ticks a shape must have been seen in, at most a fifth of them alone, before its power is
# taken to be not attributable to it (it is mixed call by call with other shapes; a tick
# that happens to hold one call of it alone says little).
MIXED_AFTER_TICKS = 3
MIXED_ALONE_SHARE = 0.2


@dataclass
class ShapeState:
    candidates: list[Configuration]
    config: Configuration  # what runs the shape's calls now
    choice: Configuration  # the shape's choice: `config`, except during a re-check
    since: float  # when `config` started running the shape
    phase: str = PROBE
    to_probe: list[Configuration] = field(default_factory=list)
    to_explore: list[Configuration] = field(default_factory=list)
    forbidden: dict[Configuration, str] = field(default_factory=dict)
    pruned: set[Configuration] = field(default_factory=set)  # too slow to be worth a power dwell
    deferred: set[Configuration] = field(default_factory=set)  # predicted over budget at the lowest duty
    seen_ticks: int = 0  # ticks in which the shape ran
    alone_ticks: int = 0  # ... of them, ticks in which nothing else ran (its power is attributable)
    samples_at_start: int = 0  # samples of `config` when it started (a dwell counts fresh ones)
    recheck_every_s: float = math.inf
    next_recheck_t: float = math.inf
    warm: bool = False  # started from a warm-start cache
    before_fallback: Configuration | None = None  # the choice to return to when readings are back

    @property
    def exploring(self) -> bool:
        return self.phase in (PROBE, EXPLORE)

    @property
    def mixed(self) -> bool:
        """Its power is not attributable: it (nearly) always ran alongside other shapes."""
        return self.seen_ticks >= MIXED_AFTER_TICKS and self.alone_ticks <= MIXED_ALONE_SHARE * self.seen_ticks

    def run(self, config: Configuration, now: float, samples: int) -> None:
        """`config` runs the shape's calls from now."""
        self.config, self.since, self.samples_at_start = config, now, samples

"""A step's tokens spread over the sensor ticks it ran in.

The governor learns tokens per second per watt from each 0.1 s tick, with the work done in
that tick. An attention call takes a millisecond, so every tick holds many; a model's step
takes tens of milliseconds to seconds, so counting its tokens when it ends would put them
all in one tick and none in the ticks before it (which the model would skip as idle, and
so overrate the configuration). Instead, while a step runs each tick is credited with the
share of its tokens that the time since the step began is of the step's expected duration
(how long that configuration's steps took before), never more than the step has; the rest
is credited when it ends. Idle time paced between steps is credited nothing, so a tick's
throughput shows the pacing.
"""
from __future__ import annotations

from flashwatt.control.governor import Work

# Weight of a new step's duration in a configuration's expected duration.
DURATION_ALPHA = 0.3


class StepCredit:
    """Spreads each step's tokens over the ticks it ran in (module docstring). Not locked: the
    controller calls it under the lock that guards its work (the sensor's thread takes a
    tick's work while the step's thread adds to it)."""

    def __init__(self):
        self._expected: dict[tuple, float] = {}  # (shape, config) -> seconds a step takes
        self._running: tuple | None = None  # (shape, config, tokens, start t)
        self._credited = 0.0

    def begin(self, shape: tuple, config, tokens: int, now: float) -> None:
        self._running = (shape, config, tokens, now)
        self._credited = 0.0

    def take(self, now: float, work: Work) -> None:
        """Credit the running step's share since it began into `work` (a tick's)."""
        if self._running is None:
            return
        shape, config, tokens, start = self._running
        expected = self._expected_s(shape, config)
        if not expected:
            return  # the first step of the first configuration: all of it at its end
        share = min(1.0, max(0.0, (now - start) / expected))
        due = tokens * share - self._credited
        if due > 0:
            work.by_key.setdefault((shape, config), [0, 0])[1] += due
            self._credited += due

    def _expected_s(self, shape: tuple, config) -> float | None:
        """A configuration's steps' duration; for its first step, that of the shape's other
        configurations (a step's length differs between them by tens of percent, not by
        the all-or-nothing a tick credited nothing would mean)."""
        own = self._expected.get((shape, config))
        if own:
            return own
        others = [s for (sh, _), s in self._expected.items() if sh == shape]
        return sum(others) / len(others) if others else None

    def abort(self) -> None:
        """The step failed (a configuration the model refused): nothing more is credited."""
        self._running = None
        self._credited = 0.0

    def end(self, now: float, work: Work) -> None:
        """The step finished: the rest of its tokens, and one call, into `work`."""
        if self._running is None:
            return
        shape, config, tokens, start = self._running
        key = (shape, config)
        entry = work.by_key.setdefault(key, [0, 0])
        entry[0] += 1
        entry[1] += tokens - self._credited
        seconds = now - start
        before = self._expected.get(key)
        self._expected[key] = seconds if before is None else before + DURATION_ALPHA * (seconds - before)
        self._running = None
        self._credited = 0.0

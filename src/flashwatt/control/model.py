"""The controller's online model: what each configuration costs, learned from its own calls.

Per (shape, configuration) it keeps exponentially weighted averages of
- GPU seconds per call (CUDA events around sampled calls): throughput at full duty;
- tokens per second per watt above idle power, at the operating point (only from ticks in
  which this one configuration and shape ran, so the power is attributable to it), and the
  share of the full-duty throughput pacing at a duty delivers (`pace_efficiency`);
- joules per token at (nearly) full duty, for the energy mode: decaying sums of watts over
  decaying sums of tokens/s, so that bursty ticks are weighed by their work.
A 10 Hz sensor cannot attribute power to one 100 µs call, so a shape whose calls are mixed
with others in every tick is ranked by GPU time per token alone (at the power cap, the
fastest configuration is also the cheapest; docs/control.md has the measurements).
Per (shape, configuration) it also keeps a duty -> power table, for the pacing loop's
feed-forward and the throughput a configuration gives under a power (a configuration draws
differently on another shape: a table of one shape says little of another's).

The throughput a configuration would give under a power: tokens per watt above idle where
it was learned near that power (within 10%: a direct measurement at the operating point);
elsewhere from its duty -> power table (the duty that draws that power, times its full-duty
throughput and its pacing efficiency), learned at every duty it ran. Tokens per watt
depends on the operating point (power curves are concave: it falls at low duty), so one
learned at 550 W and read at 300 W flatters a configuration by a quarter or more, where a
table read at 300 W is read where it was learned, or along a line from idle that errs less;
but a table's bins carry a few percent of noise, so near its own operating point tokens per
watt is the steadier figure.
"""
from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field

from flashwatt.control.configuration import Configuration

# Weight of a new observation in each running average.
ALPHA = 0.3
# Per-tick weight kept by the joules-per-token sums: a memory of about ten ticks (1 s).
J_DECAY = 0.9
# Tokens per watt is read at a power within this share of where it was learned.
ETA_NEAR = 0.10
# Two readings within this share of each other open a bin of the duty -> power table.
BIN_AGREE = 0.10
# Duty bins of the duty -> power table.
DUTY_BINS = 20
# A call this much slower than the average GPU time of its configuration is another
# process's doing (it shares the GPU's time) unless SLOW_RUN samples in a row are: only
# then does the average follow (a co-located tenant the others' watts did not show would
# otherwise make a configuration look slow for every later run, through the warm start).
SLOW_FACTOR = 1.2
SLOW_RUN = 100


def _ewma(old: float | None, new: float, alpha: float = ALPHA) -> float:
    return new if old is None else old + alpha * (new - old)


@dataclass
class Stats:
    s_per_call: float | None = None
    latency_samples: int = 0
    tokens_per_call: int = 0
    eta: float | None = None  # tokens/s per W above idle
    eta_power_w: float | None = None  # the power (ours) where `eta` was learned
    eta_samples: int = 0
    j_samples: int = 0
    # Joules per token as a ratio of decaying sums (watts over tokens/s, ticks being of one
    # length), not an average of per-tick ratios: a tick's token count is bursty when the
    # calls are a part of a larger step (a model's attention), and a ratio of sums weighs
    # each tick by its work instead of letting a nearly empty tick count as much as a full one.
    j_power_sum: float = 0.0
    j_rate_sum: float = 0.0
    pace_efficiency: float | None = None  # tokens/s at a duty over duty x tokens/s at full duty
    slow_samples: int = 0  # latency samples in a row far slower than the average (Stats not moved by them yet)

    @property
    def j_per_token(self) -> float | None:
        return self.j_power_sum / self.j_rate_sum if self.j_rate_sum > 0 else None

    @property
    def tokens_per_s_full(self) -> float | None:
        if not self.s_per_call or not self.tokens_per_call:
            return None
        return self.tokens_per_call / self.s_per_call


@dataclass
class PowerTable:
    """Average power seen at each duty bin for one configuration (pacing feed-forward).
    A bin is opened by two readings that agree (within BIN_AGREE), so that one reading taken
    in a transient does not define it; later ones move it slowly."""

    bins: dict[int, float] = field(default_factory=dict)
    pending: dict[int, float] = field(default_factory=dict)  # a bin's first reading, awaiting a second

    def add(self, duty: float, power_w: float) -> None:
        b = min(DUTY_BINS, max(0, round(duty * DUTY_BINS)))
        if b in self.bins:
            self.bins[b] = _ewma(self.bins[b], power_w, 0.1)  # slower than the governor's offset
            return
        first = self.pending.get(b)
        if first is not None and abs(power_w - first) <= BIN_AGREE * max(first, power_w):
            self.bins[b] = 0.5 * (first + power_w)
            del self.pending[b]
        else:
            self.pending[b] = power_w

    def _curve(self, idle_w: float) -> tuple[list[float], list[float]]:
        """(duties, powers) of the table made monotone, with idle power at duty 0: the
        closest non-decreasing curve (adjacent bins that disagree are pooled to their mean),
        so one bin read high does not raise every bin above it, as a running maximum would."""
        duties = [0.0] + [b / DUTY_BINS for b in sorted(self.bins)]
        blocks: list[list[float]] = []  # [mean, count], pool-adjacent-violators
        for value in [idle_w] + [self.bins[b] for b in sorted(self.bins)]:
            blocks.append([value, 1.0])
            while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
                (m1, n1), (m2, n2) = blocks[-2], blocks.pop()
                blocks[-1] = [(m1 * n1 + m2 * n2) / (n1 + n2), n1 + n2]
        powers = [mean for mean, n in blocks for _ in range(int(n))]
        powers[0] = idle_w if powers[0] > idle_w else powers[0]
        return duties, [max(powers[0], p) for p in powers]

    def power_at(self, duty: float, idle_w: float) -> float | None:
        """Power expected at this duty, interpolated; None past the highest duty seen."""
        if not self.bins:
            return None
        duties, powers = self._curve(idle_w)
        if duty > duties[-1] + 0.5 / DUTY_BINS:
            return None
        i = min(len(duties) - 1, bisect.bisect_left(duties, duty))
        if i == 0 or duties[i] == duties[i - 1]:
            return powers[i]
        frac = min(1.0, (duty - duties[i - 1]) / (duties[i] - duties[i - 1]))
        return powers[i - 1] + frac * (powers[i] - powers[i - 1])

    def extrapolated_power(self, duty: float, idle_w: float) -> float | None:
        """`power_at`, and past the highest duty seen, along the chord from idle through it
        (over a concave curve the chord lies above the curve there: it errs towards more
        watts); None without an observed bin above idle."""
        seen = self.power_at(duty, idle_w)
        if seen is not None:
            return seen
        if not self.bins:
            return None
        duties, powers = self._curve(idle_w)
        if duties[-1] <= 0 or powers[-1] <= idle_w:
            return None
        return idle_w + (powers[-1] - idle_w) * duty / duties[-1]

    def duty_for(self, power_w: float, idle_w: float) -> float | None:
        """Duty expected to draw `power_w`, by interpolation over the table made monotone
        (with idle power at duty 0); None with fewer than one observed bin."""
        if not self.bins:
            return None
        duties, powers = self._curve(idle_w)
        if power_w >= powers[-1]:
            # past the most seen: along the chord from idle (under a concave curve the true
            # duty is higher, so this errs towards less power), up to full duty
            if duties[-1] >= 1.0 or powers[-1] <= idle_w or duties[-1] <= 0:
                return 1.0 if duties[-1] >= 1.0 else None
            slope = (powers[-1] - idle_w) / duties[-1]
            return min(1.0, duties[-1] + (power_w - powers[-1]) / slope)
        i = bisect.bisect_left(powers, power_w)
        if i == 0:
            return 0.0
        p0, p1, d0, d1 = powers[i - 1], powers[i], duties[i - 1], duties[i]
        return d0 if p1 == p0 else d0 + (power_w - p0) / (p1 - p0) * (d1 - d0)


class OnlineModel:
    def __init__(self) -> None:
        self.stats: dict[tuple, Stats] = {}
        self.power: dict[tuple, PowerTable] = {}  # (shape, config) -> its duty -> power table
        self.mix_power = PowerTable()  # the duty -> power table of several shapes sharing the GPU

    def entry(self, shape: tuple, config: Configuration) -> Stats:
        key = (shape, config)
        if key not in self.stats:
            self.stats[key] = Stats()
        return self.stats[key]

    def add_latency(self, shape: tuple, config: Configuration, seconds: float, tokens: int) -> None:
        if not (seconds > 0 and math.isfinite(seconds)):
            return
        s = self.entry(shape, config)
        if s.s_per_call is not None and s.latency_samples >= 3 and seconds > SLOW_FACTOR * s.s_per_call:
            s.slow_samples += 1
            if s.slow_samples < SLOW_RUN:
                return
        else:
            s.slow_samples = 0
        s.s_per_call = _ewma(s.s_per_call, seconds)
        s.latency_samples += 1
        s.tokens_per_call = tokens

    def add_tick(self, shape: tuple, config: Configuration, tokens_per_s: float, power_w: float,
                 idle_w: float, duty: float, comparable: bool = True) -> None:
        """One tick in which only this (shape, configuration) ran, at this duty, drawing
        `power_w` of its own (other tenants' watts already taken out)."""
        s = self.entry(shape, config)
        above = power_w - idle_w
        # tokens/s per watt is compared across configurations only where it was measured at
        # the same operating point (power curves are concave: it is higher at low power)
        if tokens_per_s > 0 and above > 1.0 and comparable:
            s.eta = _ewma(s.eta, tokens_per_s / above)
            s.eta_power_w = _ewma(s.eta_power_w, power_w)
            s.eta_samples += 1
            if s.tokens_per_s_full and duty > 0:
                s.pace_efficiency = _ewma(s.pace_efficiency, min(1.2, tokens_per_s / (duty * s.tokens_per_s_full)))
        if duty >= 0.98 and power_w > 0 and tokens_per_s >= 0:
            s.j_power_sum = J_DECAY * s.j_power_sum + power_w
            s.j_rate_sum = J_DECAY * s.j_rate_sum + tokens_per_s
            s.j_samples += 1
        self.power.setdefault((shape, config), PowerTable()).add(duty, power_w)

    def throughput_at(self, shape: tuple, config: Configuration, power_w: float, idle_w: float) -> float | None:
        """Predicted tokens/s of this configuration when it may draw `power_w` (module
        docstring): by tokens/s per watt above idle learned near that power, else by its
        duty -> power table, else by tokens/s per watt learned elsewhere (capped by its
        full-duty throughput), else its full-duty throughput."""
        s = self.stats.get((shape, config))
        if s is None or s.tokens_per_s_full is None:
            return None
        if s.eta is not None and s.eta_power_w is not None and abs(s.eta_power_w - power_w) <= ETA_NEAR * power_w:
            return min(s.tokens_per_s_full, s.eta * max(0.0, power_w - idle_w))
        table = self.power.get((shape, config))
        duty = table.duty_for(power_w, idle_w) if table is not None else None
        if duty is not None:
            return s.tokens_per_s_full * min(1.0, max(0.0, duty)) * min(1.0, s.pace_efficiency or 1.0)
        if s.eta is not None:
            return min(s.tokens_per_s_full, s.eta * max(0.0, power_w - idle_w))
        return s.tokens_per_s_full

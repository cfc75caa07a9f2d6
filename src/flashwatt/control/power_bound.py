"""How much power a configuration is expected to draw at a duty, and the most duty it may be
given under a power: the bound that keeps exploration and re-checks within the budget.

A configuration seen before is predicted by its own duty -> power table
(flashwatt.control.model.PowerTable; past the highest duty it has run at, along the chord
from idle, which over-predicts a concave curve there). One never seen is predicted by a
prior: all of the board's range above idle (the enforced limit, the most any configuration
can draw) scaled by duty ** PRIOR_EXPONENT. Measured curves are concave (on the H100, power
above idle grew as duty ** 0.56 from full to half duty and ** 0.75 to 0.3, under the power
cap; docs/control.md); a smaller exponent is more
concave still, so the prior errs towards more watts and a new configuration starts under
its set point, and the pacing loop brings it up.
"""
from __future__ import annotations

from flashwatt.control.model import OnlineModel

PRIOR_EXPONENT = 0.5
# Board range above idle assumed where the enforced limit is unknown.
DEFAULT_RANGE_W = 500.0
# The most any configuration draws at a duty is the prior plus this share of the board's range
# (most_power): the prior is more than every measured curve draws below about duty 0.6, but
# not above it (on the H100 cuDNN drew 632 W at duty 0.7, 25 W or 4% of the range over it).
ABOVE_PRIOR = 0.15


def board_range(idle_w: float, limit_w: float | None) -> float:
    """Watts the board can draw above idle: up to its enforced limit, else DEFAULT_RANGE_W."""
    return (limit_w - idle_w) if limit_w and limit_w > idle_w else DEFAULT_RANGE_W


def prior_power(duty: float, idle_w: float, limit_w: float | None) -> float:
    span = board_range(idle_w, limit_w)
    return idle_w + span * max(0.0, duty) ** PRIOR_EXPONENT


def most_power(duty: float, idle_w: float, limit_w: float | None) -> float:
    """The most any configuration of ours draws at `duty`: the prior, plus ABOVE_PRIOR of the
    board's range (the prior bounds the measured curves only up to about duty 0.6)."""
    return prior_power(duty, idle_w, limit_w) + ABOVE_PRIOR * board_range(idle_w, limit_w)


def predicted_power(model: OnlineModel, key: tuple, duty: float, idle_w: float, limit_w: float | None) -> float:
    """Watts the configuration of `key` (shape, configuration) is expected to draw at `duty`
    (ours alone, no tenant)."""
    table = model.power.get(key)
    predicted = table.extrapolated_power(duty, idle_w) if table is not None else None
    return predicted if predicted is not None else prior_power(duty, idle_w, limit_w)


def bounded_duty(model: OnlineModel, key: tuple, watts: float, idle_w: float, limit_w: float | None,
                 d_min: float, d_max: float) -> float | None:
    """The highest duty in [d_min, d_max] at which the configuration of `key` (shape,
    configuration) is predicted to draw at most `watts`; None when even `d_min` is
    predicted to draw more."""
    if predicted_power(model, key, d_min, idle_w, limit_w) > watts:
        return None
    table = model.power.get(key)
    if table is not None and table.bins:
        duty = table.duty_for(watts, idle_w)
        if duty is not None:
            return min(d_max, max(d_min, duty))
    return prior_duty(watts, idle_w, limit_w, d_min, d_max)


def prior_duty(watts: float, idle_w: float, limit_w: float | None, d_min: float, d_max: float) -> float:
    """The duty at which the prior predicts `watts` (clipped to [d_min, d_max])."""
    span = board_range(idle_w, limit_w)
    share = min(1.0, max(0.0, watts - idle_w) / span)
    return min(d_max, max(d_min, share ** (1.0 / PRIOR_EXPONENT)))

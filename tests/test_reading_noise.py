"""How noisy one power reading is (flashwatt.control.reading_noise), learned from the readings:
white instant readings from consecutive pairs, and readings that each average a window
longer than a tick (a step's power from the energy counter) from pairs a window apart."""
from __future__ import annotations

import random
import statistics

from flashwatt.control.reading_noise import ReadingNoise

IDLE_W, LEVEL_W = 100.0, 600.0  # 500 W above idle


def learned(readings, lag: int) -> float:
    """The learned share, averaged over the readings after the first 500 (one estimate
    follows the last few dozen pairs and scatters about its level)."""
    noise, shares = ReadingNoise(IDLE_W), []
    for reading in readings:
        noise.add(reading, LEVEL_W, still=True, lag=lag, duty=0.5)
        shares.append(noise.share)
    return statistics.fmean(shares[500:])


def test_white_readings_are_learned_from_consecutive_pairs():
    rng = random.Random(3)
    readings = [LEVEL_W + rng.gauss(0.0, 40.0) for _ in range(3000)]  # 8% of the watts above idle
    # (the estimate rises faster than it falls, so it sits a little over the truth)
    assert 0.08 <= learned(readings, lag=1) <= 1.25 * 0.08


def test_readings_that_average_a_window_are_learned_from_pairs_a_window_apart():
    """1 s windows read every 0.1 s (ten ticks) of a board whose power wanders from tick to
    tick: consecutive windows share nine tenths of their ticks, so their difference shows a
    fraction of each window's error. A window apart, the whole of it."""
    rng = random.Random(5)
    ticks = [LEVEL_W + rng.gauss(0.0, 120.0) for _ in range(4000)]
    windows = [statistics.fmean(ticks[i - 10:i]) for i in range(10, len(ticks))]
    spread = statistics.pstdev(windows) / (LEVEL_W - IDLE_W)  # about 0.076
    assert 0.95 * spread <= learned(windows, lag=10) <= 1.25 * spread
    assert learned(windows, lag=1) < 0.5 * spread  # consecutive pairs: a third of it


def test_a_pair_over_which_the_duty_crept_teaches_nothing():
    noise = ReadingNoise(IDLE_W)
    for i in range(200):
        # power follows a duty creeping 0.01 per tick: a window apart it moved 0.1 and 50 W
        noise.add(LEVEL_W + 5.0 * i, LEVEL_W, still=True, lag=10, duty=0.3 + 0.01 * i)
    assert noise.share == 0.10  # the prior, untouched


def test_a_move_of_the_duty_starts_the_pairs_again():
    noise = ReadingNoise(IDLE_W)
    for i in range(100):
        # the duty moved before every reading: no pair holds only the board's noise
        noise.add(LEVEL_W + (200.0 if i % 2 else 0.0), LEVEL_W, still=False, lag=1, duty=0.5)
    assert noise.share == 0.10

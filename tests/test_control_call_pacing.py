"""The pacing of attention calls in whole cycles (flashwatt.control.pacing, `target_cycle_s`,
opt-in): the idle a duty owes is paid once a cycle of it is owed, so the board idles for
tens of milliseconds at a time rather than 2 ms, and the controller reads the energy
counter over those cycles (their length is what `cycle_s` measures); without a cycle, each
2 ms quantum is paid as it is owed."""
from __future__ import annotations

import pytest

from flashwatt.control.pacing import DeviceOps, Pacer


class Board:
    """A host clock that calls and sleeps advance: a call of g seconds is g of busy time
    (the queue drains as it is issued, as on the CPU), a sleep its own length."""

    def __init__(self, duty: float):
        self.t = 0.0
        self.duty = duty
        self.sleeps: list[tuple[float, float]] = []  # (start, seconds) of each slice

    def sleep(self, seconds: float) -> None:
        self.sleeps.append((self.t, seconds))
        self.t += seconds

    def pacer(self, target_cycle_s: float) -> Pacer:
        return Pacer(DeviceOps(None, lambda: self.t), lambda: self.duty, clock=lambda: self.t, sleep=self.sleep,
                     target_cycle_s=target_cycle_s)

    def calls(self, pacer: Pacer, seconds: float, gpu_s: float = 0.001) -> None:
        end = self.t + seconds
        while self.t < end:
            self.t += gpu_s
            pacer.after_call(gpu_s)


def idle_stretches(sleeps: list[tuple[float, float]]) -> list[float]:
    """Consecutive sleep slices joined: the idle stretches the board saw."""
    stretches: list[list[float]] = []
    for start, seconds in sleeps:
        if stretches and abs(stretches[-1][0] + stretches[-1][1] - start) < 1e-9:
            stretches[-1][1] += seconds
        else:
            stretches.append([start, seconds])
    return [s for _, s in stretches]


@pytest.mark.parametrize("duty", [0.3, 0.5, 0.7, 0.9])
def test_calls_idle_in_whole_cycles_at_the_duty(duty):
    board = Board(duty)
    pacer = board.pacer(0.25)
    board.calls(pacer, 5.0)
    stretches = idle_stretches(board.sleeps)
    assert len(stretches) > 10
    # each stretch is one cycle's idle, however the 50 ms slices split it
    assert min(stretches[1:]) == pytest.approx(0.25 * (1 - duty), rel=0.02)
    assert pacer.cycle_s == pytest.approx(0.25, rel=0.02)
    busy = 1 - sum(stretches) / board.t
    assert busy == pytest.approx(duty, abs=0.01)


def test_without_a_cycle_the_debt_is_paid_each_quantum():
    board = Board(0.5)
    pacer = board.pacer(0.0)
    board.calls(pacer, 1.0)
    stretches = idle_stretches(board.sleeps)
    assert max(stretches) == pytest.approx(pacer.quantum_s, rel=0.6)
    assert pacer.cycle_s == 0.0  # the controller reads the instant power


def test_a_cut_in_the_middle_of_a_cycle_idles_at_once():
    """A busy stretch already longer than the new duty's share of a cycle is paid at the
    next call, not at the end of the old duty's cycle."""
    board = Board(0.9)
    pacer = board.pacer(0.25)
    board.calls(pacer, 0.1)  # 0.1 s busy: under the 0.225 s a cycle at 0.9 holds
    assert not board.sleeps
    board.duty = 0.3
    board.calls(pacer, 0.001)
    assert board.sleeps and board.sleeps[0][0] == pytest.approx(0.101, abs=1e-3)
    # 0.1 s of busy time owes 0.1 x 0.7 / 0.3 s at the new duty
    assert sum(idle_stretches(board.sleeps)[:1]) == pytest.approx(0.101 * 0.7 / 0.3, rel=0.02)


def test_full_duty_runs_no_cycle():
    board = Board(0.5)
    pacer = board.pacer(0.25)
    board.calls(pacer, 3.0)
    assert pacer.cycle_s > 0.2
    board.duty = 1.0
    slept = len(board.sleeps)
    board.calls(pacer, 0.5)
    assert len(board.sleeps) == slept
    assert pacer.cycle_s == 0.0  # the controller goes back to the instant reading

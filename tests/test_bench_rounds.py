"""The benchmark's rounds: each round times every backend once, in an order rotated so that
no backend is always timed first or right after the same one; bad --rounds is refused
before anything is built or timed."""
from __future__ import annotations

import pytest

from flashwatt import bench


def test_each_round_times_every_backend_once_in_a_rotated_order():
    names = [f"k{i}" for i in range(7)]
    orders = [bench.round_order(names, r, 3) for r in range(3)]
    for order in orders:
        assert sorted(order) == sorted(names)
    assert len({order[0] for order in orders}) == 3
    # with as many rounds as backends, each backend is first once and last once
    full = [bench.round_order(names, r, len(names)) for r in range(len(names))]
    assert sorted(order[0] for order in full) == sorted(names)
    assert sorted(order[-1] for order in full) == sorted(names)
    assert bench.round_order(names, 0, 1) == names
    assert bench.round_order([], 2, 3) == []


def test_bad_rounds_are_refused_by_name(capsys):
    with pytest.raises(SystemExit):
        bench.main(["--rounds", "0"])
    assert "--rounds 0" in capsys.readouterr().err

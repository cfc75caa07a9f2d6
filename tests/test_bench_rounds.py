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


def test_a_shape_names_its_kv_heads_for_grouped_query_attention():
    assert bench.parse_shape("1x32x4096x128") == (1, 32, 4096, 128, 32)
    assert bench.parse_shape("1X32/8x4096x64") == (1, 32, 4096, 64, 8)
    for bad in ("1x32x4096", "1x32/5x4096x128", "1x0x4096x128", "1x32/0x4096x128", "1x32/8/2x4096x128"):
        with pytest.raises(ValueError):
            bench.parse_shape(bad)


@pytest.mark.parametrize("argv, named", [(["--shapes", "1x32/5x4096x128"], "--shapes"),
                                         (["--masks", "causal,sliding"], "--masks")])
def test_bad_shapes_and_masks_are_refused_by_name(argv, named, capsys):
    with pytest.raises(SystemExit):
        bench.main(argv)
    assert named in capsys.readouterr().err


def test_grouped_query_inputs_give_k_and_v_their_own_heads():
    import torch

    from flashwatt.attention.cell import Cell
    from flashwatt.measure import input_bytes, make_inputs

    cell = Cell("bench", "sdpa_math", "fp32", 16, 2, 8, 4, True)
    q, k, v = make_inputs(cell, torch.device("cpu"), 0, 1, kv_heads=2)[0]
    assert q.shape == (2, 8, 16, 4) and k.shape == v.shape == (2, 2, 16, 4)
    assert [t.shape for t in make_inputs(cell, torch.device("cpu"), 0, 1)[0]] == [(2, 8, 16, 4)] * 3
    # the sets rotated past L2 are counted at their own size: q at 8 heads, k and v at 2
    assert input_bytes(cell, kv_heads=2) == sum(t.numel() * t.element_size() for t in (q, k, v))
    assert input_bytes(cell) == 3 * q.numel() * q.element_size()

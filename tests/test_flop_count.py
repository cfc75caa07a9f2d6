"""The attention FLOP count (flashwatt.flop_count), and the cells that count with it."""
from __future__ import annotations

import itertools

import pytest

from flashwatt.attention.cell import Cell
from flashwatt.flop_count import attention_flops


def test_the_forward_is_two_matmuls_halved_under_a_causal_mask():
    assert attention_flops(2, 3, 5, 7, causal=False) == 4 * 2 * 3 * 5 * 5 * 7
    assert attention_flops(2, 3, 5, 7, causal=True) == 2 * 2 * 3 * 5 * 5 * 7
    assert attention_flops(1, 1, 4096, 128, causal=False) == attention_flops(1, 1, 4096, 128, False, "fwd")


def test_forward_and_backward_count_three_and_a_half_forwards():
    for causal in (False, True):
        assert attention_flops(4, 8, 1024, 64, causal, "fwd_bwd") == 3.5 * attention_flops(4, 8, 1024, 64, causal)


def test_an_unknown_pass_is_refused_by_name():
    with pytest.raises(ValueError, match="pass 'bwd'"):
        attention_flops(1, 1, 16, 16, False, "bwd")


@pytest.mark.parametrize("causal, pass_", list(itertools.product([False, True], ["fwd", "fwd_bwd"])))
def test_attention_and_distributed_cells_count_alike(causal, pass_):
    from flashwatt.distributed.job import flops

    cell = Cell("s", "naive", "bf16", 2048, 2, 16, 128, causal, pass_)
    spec = {"batch": 2, "heads": 16, "seq_len": 2048, "head_dim": 128, "causal": causal, "pass": pass_}
    assert cell.flops == flops(spec) == attention_flops(2, 16, 2048, 128, causal, pass_)
    assert cell.fwd_flops == attention_flops(2, 16, 2048, 128, causal)

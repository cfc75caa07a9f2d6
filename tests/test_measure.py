import math

import pytest
import torch

from flashwatt.attention.cell import Cell
from flashwatt.measure import (Check, check_cell, check_rows, make_inputs, reference_attention,
                               relative_error, warm_up)
from flashwatt.vocabulary import TOLERANCE

CPU = torch.device("cpu")


def cell(**kw):
    base = dict(suite="smoke", kernel="naive", precision="fp32", seq_len=40, batch=2, heads=3, head_dim=16)
    return Cell(**{**base, **kw})


def test_inputs_are_seeded_random_and_never_zero():
    a = make_inputs(cell(), CPU, seed=1, sets=2)
    b = make_inputs(cell(), CPU, seed=1, sets=2)
    assert all(torch.equal(x, y) for x, y in zip(a[0], b[0]))
    assert not torch.equal(a[0][0], a[1][0])  # sets differ
    assert 0.8 < a[0][0].std().item() < 1.2 and a[0][0].abs().min() >= 0 and a[0][0].count_nonzero() > 0


def test_reference_matches_closed_form_on_one_key():
    # With one key, attention returns v whatever q is.
    q, k, v = (torch.randn(1, 1, 1, 8, dtype=torch.float64) for _ in range(3))
    assert torch.allclose(reference_attention(q, k, v, causal=False), v)


def test_reference_rows_subset_equals_full_rows():
    q, k, v = (torch.randn(2, 33, 8) for _ in range(3))
    rows = check_rows(33, 5)
    assert rows[0] == 0 and rows[-1] == 32 and len(rows) == 5
    full = reference_attention(q, k, v, causal=True)
    assert torch.allclose(reference_attention(q, k, v, True, rows), full[:, rows])


def test_relative_error_nan_never_passes():
    ref = torch.ones(4, dtype=torch.float64)
    assert math.isnan(relative_error(torch.tensor([1.0, float("nan"), 1.0, 1.0]), ref))
    check = Check(float("nan"), 1e-5, None, None, 4, 1, finite=False)
    assert not check.passed


class WrongSoftmax:
    """Skips the softmax normalisation: the kind of 'fast kernel' the check must catch."""
    name, differentiable = "wrong", True

    def __call__(self, q, k, v, c):
        return (q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])).exp() @ v


class Naive:
    name, differentiable = "naive", True

    def __call__(self, q, k, v, c):
        return reference_attention(q, k, v, c.causal).to(q.dtype)


@pytest.mark.parametrize("pass_", ["fwd", "fwd_bwd"])
def test_check_passes_exact_and_fails_wrong_kernel(pass_):
    c = cell(pass_=pass_, causal=True)
    q, k, v = make_inputs(c, CPU, seed=0, sets=1)[0]
    good = check_cell(Naive(), c, q, k, v, max_rows=16, seed=0)
    assert good.passed and good.rel_err < TOLERANCE["fp32"]["fwd"]
    assert (good.grad_rel_err is not None) == (pass_ == "fwd_bwd")
    bad = check_cell(WrongSoftmax(), c, q, k, v, max_rows=16, seed=0)
    assert not bad.passed and bad.rel_err > 0.1




def test_cpu_allocation_failure_is_oom():
    from flashwatt.measure import is_oom

    try:
        torch.empty(1 << 62, dtype=torch.uint8)  # 4 EiB: no host can give it
    except Exception as err:  # torch's CPU allocator raises a RuntimeError, not MemoryError
        assert is_oom(err), err
    else:
        pytest.fail("a 4 EiB allocation succeeded")
    assert is_oom(MemoryError())
    assert not is_oom(RuntimeError("shapes do not match"))

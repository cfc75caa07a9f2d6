"""Merging partial attention results by log-sum-exp.

Two partial results over disjoint key sets, (o1, lse1) and (o2, lse2), combine exactly:
lse = log(e^lse1 + e^lse2), o = o1 e^(lse1 - lse) + o2 e^(lse2 - lse). The running sums
are kept in float32 (float64 when the inputs are float64) whatever the block dtype, so
the merge adds no error of its own beyond the block's.
"""
from __future__ import annotations

import torch


def accumulation_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


class LseMerge:
    """Running merged output and LSE over a rank's local query rows."""

    def __init__(self, q: torch.Tensor):
        dtype = accumulation_dtype(q.dtype)
        self.out = torch.zeros(q.shape, dtype=dtype, device=q.device)
        self.lse = torch.full(q.shape[:3], float("-inf"), dtype=dtype, device=q.device)

    def add(self, out: torch.Tensor, lse: torch.Tensor, rows: slice = slice(None)) -> None:
        """Fold one block's (out, lse) into query rows `rows` of the running result."""
        old_lse = self.lse[:, :, rows]
        lse = lse.to(old_lse.dtype)
        new_lse = torch.logaddexp(old_lse, lse)
        # Rows that no block has reached yet have lse = -inf on both sides; shift by 0
        # there so the weights are exp(-inf) = 0 instead of NaN.
        shift = torch.where(torch.isinf(new_lse), torch.zeros_like(new_lse), new_lse)
        w_old = torch.exp(old_lse - shift).unsqueeze(-1)
        w_new = torch.exp(lse - shift).unsqueeze(-1)
        # Basic slicing is a view: the running output is updated in place, no full-size copy.
        self.out[:, :, rows].mul_(w_old).add_(out.to(self.out.dtype) * w_new)
        self.lse[:, :, rows] = new_lse

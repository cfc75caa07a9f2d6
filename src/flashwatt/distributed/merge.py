"""Merging partial attention results by log-sum-exp.

Two partial results over disjoint key sets, (o1, lse1) and (o2, lse2), combine exactly:
lse = log(e^lse1 + e^lse2) and o = (1 - w) o1 + w o2 with w = e^lse2 / (e^lse1 + e^lse2)
= sigmoid(lse2 - lse1). Written as o1 - w (o1 - o2), the weights of the two parts sum to
one exactly whatever the rounding of the LSEs (the kernels give them in float32, about
5e-7 absolute at lse ~ 8): the rounding moves only w, by at most a quarter of the LSE
difference's error, never the scale of the whole output as exp(lse_i - lse) weights would.
The running sums are float32 (float64 for float64 inputs) whatever the block dtype.
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
        # Rows no block has reached yet have lse = -inf: w = sigmoid(+inf) = 1 takes the
        # block as it is. Both -inf (no key on either side) gives NaN: keep the old (zero).
        w = torch.sigmoid(lse - old_lse).nan_to_num_(nan=0.0).unsqueeze(-1)
        running = self.out[:, :, rows]  # basic slicing: a view, updated in place
        running.sub_(w * (running - out.to(running.dtype)))
        self.lse[:, :, rows] = torch.logaddexp(old_lse, lse)

"""The blocks a strategy computes with: each registry backend's (out, lse) form, by name.

A block is attention of one query block against one key/value block that also returns
the log-sum-exp of each query row (flashwatt.kernels.blocks); which backend has one, and
what it runs, is declared in flashwatt.kernels.registry, and `get_block` asks it.
"""
from __future__ import annotations

import torch

from flashwatt.distributed.inputs import DTYPES
from flashwatt.kernels.declaration import load
from flashwatt.kernels.registry import block_names, runnable_block

BLOCK_NAMES = block_names()

# The precision of a block's inputs by their dtype, as the registry names it: float32
# is fp32 (a tf32 cell's inputs too; every block that takes one takes the other).
_PRECISION_OF = {dtype: name for name, dtype in DTYPES.items() if name != "tf32"}


def get_block(block, q: torch.Tensor):
    """A block object from its name, for inputs like `q`; `auto` (sdpa_default's block)
    picks as PyTorch would: math on CPU or for float64, efficient for float32 on CUDA
    (flash has no fp32 path), flash for fp16/bf16 on CUDA. ValueError when the block
    cannot take q's dtype, head dim or device."""
    if not isinstance(block, str):
        return block  # a user-supplied object with forward/backward/differentiable
    precision = _PRECISION_OF.get(q.dtype, str(q.dtype).removeprefix("torch."))
    return load(runnable_block(block, precision, q.device.type, q.shape[-1]).implementation)()

"""What one attention call asks of a backend, described without tensors.

A backend says whether it can run a call (`supports`) before any tensor exists: an
attention cell, a model's layer, the controller and a distributed block each describe
the call they are about to make with an `AttentionCall`, and the backend registry
(flashwatt.kernels.registry) answers from the backend's declaration and, where the
declaration cannot say (a device's compute capability, a launch variant), from the
implementation itself. An attention `Cell` (flashwatt.attention.cell) carries the same
fields under the same names, K/V heads aside (it has as many as query heads), so a
kernel reads either.

Torch-free, as is the registry: config validation and the workflow's planning import it.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class AttentionCall:
    precision: str  # fp32, tf32 (fp32 storage, tensor-core arithmetic), fp16, bf16
    seq_len: int  # queries, and keys: self-attention over the whole sequence
    batch: int
    heads: int  # query heads
    head_dim: int
    causal: bool = False  # top-left aligned, as torch's is_causal
    pass_: str = "fwd"  # fwd, or fwd_bwd when a gradient will be asked for
    variant: str = ""  # a launch of our kernel (flashwatt.kernels.custom's grammar), "" its default
    kv_heads: int | None = None  # K/V heads (grouped-query attention: a divisor of heads); None: as many as heads

"""The one contract every attention backend implements.

A kernel takes q, k, v of shape (batch, heads, seq_len, head_dim) on one device, in the
cell's storage dtype, and returns the attention output of q's shape and dtype,
softmax(q kᵀ / sqrt(head_dim)) v with the causal mask when the cell asks for it. k and v
may have fewer heads than q, a divisor of them (grouped-query attention: query head h
reads K/V head h // (heads / kv_heads)), as the Llama models flashwatt runs have.
`supports` answers before any work is done: None when the kernel can run the cell, or
a sentence saying why not, which becomes the reason of a "skipped" record.

A kernel may also define `describe(cell) -> dict` (called after its first successful
run) for facts the record should carry: for a compiled kernel its build (key, seconds)
and the launch configuration the cell's variant resolved to.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import torch

    from flashwatt.attention.cell import Cell


class UnsupportedCell(RuntimeError):
    """Raised by a kernel at call time when its backend refuses the inputs (a "skipped" record)."""


class Kernel(Protocol):
    name: str
    # Whether the kernel has a backward pass (fwd_bwd cells need one).
    differentiable: bool

    def supports(self, cell: "Cell", device: "torch.device") -> str | None: ...

    def __call__(self, q: "torch.Tensor", k: "torch.Tensor", v: "torch.Tensor", cell: "Cell") -> "torch.Tensor": ...

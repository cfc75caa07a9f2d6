"""The one contract every attention backend implements.

A kernel takes q, k, v of shape (batch, heads, seq_len, head_dim) on one device, in the
call's storage dtype, and returns the attention output of q's shape and dtype,
softmax(q kᵀ / sqrt(head_dim)) v with the causal mask when the call asks for it. k and v
may have fewer heads than q, a divisor of them (grouped-query attention: query head h
reads K/V head h // (heads / kv_heads)), as the Llama models flashwatt runs have. The
call's description (`flashwatt.kernels.call.AttentionCall`, or an attention Cell, which
has the same fields) says what is asked: precision, mask, pass, launch variant.
`supports` answers before any work is done: None when the kernel can run the call, or
a sentence saying why not, which becomes the reason of a "skipped" record.

An implementation defines `__call__`; what it supports is declared in the registry
(flashwatt.kernels.registry), and `supports(call, device)` on the implementation adds
only what the declaration cannot say (a device's compute capability, a launch variant).
`flashwatt.kernels.get_kernel` hands out the implementation behind its declaration,
which has the whole contract below.

A kernel may also define `describe(call) -> dict` (called after its first successful
run) for facts the record should carry: for a compiled kernel its build (key, seconds)
and the launch configuration the call's variant resolved to.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import torch

    from flashwatt.kernels.call import AttentionCall


class UnsupportedCell(RuntimeError):
    """Raised by a kernel at call time when its backend refuses the inputs (a "skipped" record)."""


class Kernel(Protocol):
    name: str
    # Whether the kernel has a backward pass (fwd_bwd cells need one).
    differentiable: bool

    def supports(self, call: "AttentionCall", device: "torch.device") -> str | None: ...

    def __call__(self, q: "torch.Tensor", k: "torch.Tensor", v: "torch.Tensor",
                 call: "AttentionCall") -> "torch.Tensor": ...

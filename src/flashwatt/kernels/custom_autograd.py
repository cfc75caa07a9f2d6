"""flashwatt's attention as a differentiable torch operation: the custom forward
(flashwatt.kernels.custom_forward.flash_forward) and its backward (flashwatt.kernels.custom_backward).

`flash_attention` goes through autograd only when a gradient can be asked for (grad mode
on and some input requiring it); otherwise it is the plain forward, with nothing saved.
A causal mask is aligned top-left (the default, torch's is_causal) or bottom-right
(`causal_align="bottom_right"`, FlashAttention >= 2.1) where Lq != Lk, in the forward and
the backward alike (flashwatt.kernels.custom_mask).
"""
from __future__ import annotations

import math

import torch
from torch.autograd.function import once_differentiable

from flashwatt.kernels.custom_backward import BackwardPlan, backward_plan, flash_backward
from flashwatt.kernels.custom_forward import flash_forward
from flashwatt.kernels.custom_inputs import capability, check_inputs, precision_of
from flashwatt.kernels.custom_mask import CAUSAL_TOP_LEFT, check_causal_align


class FlashAttentionFunction(torch.autograd.Function):
    """out = attention(q, k, v) on (B, H, L, D) views; saves q, k, v, out and the LSE."""

    @staticmethod
    def forward(ctx, q, k, v, causal: bool, variant: str, precision: str | None, scale: float, plan: BackwardPlan,
                l2_section: int | None, causal_align: str):
        out, lse = flash_forward(q, k, v, causal, variant, precision=precision, scale=scale, l2_section=l2_section,
                                 causal_align=causal_align)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.causal, ctx.causal_align = causal, causal_align
        ctx.scale, ctx.plan, ctx.l2_section = scale, plan, l2_section
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = flash_backward(dout, q, k, v, out, lse, ctx.causal, ctx.scale, ctx.plan, ctx.l2_section,
                                    ctx.causal_align)
        return dq, dk, dv, None, None, None, None, None, None, None


def flash_attention(q, k, v, causal: bool, variant: str = "", layout: str = "bhld", *, scale: float | None = None,
                    precision: str | None = None, backward_tile: str | None = None, l2_section: int | None = None,
                    deterministic: bool | None = None, causal_align: str = CAUSAL_TOP_LEFT):
    """Attention output, differentiable in q, k and v.

    Arguments as flashwatt.kernels.custom_forward.flash_forward (layout "bhld" or "blhd";
    causal_align "top_left" or "bottom_right": where a causal mask's diagonal lies when
    Lq != Lk, flashwatt.kernels.custom_mask; a query that sees no key gets an output of 0
    and zero gradients).
    backward_tile: a name of custom_backward.BWD_TILES (None: the default for the head dim).
    l2_section: the forward's and the backward's L2 section size (flashwatt.kernels.l2_sections).
    deterministic: a backward bit-identical run to run (dQ without atomics); None: what
    torch.use_deterministic_algorithms set (torch.are_deterministic_algorithms_enabled()).
    When a gradient may be needed, the backward plan is checked before the forward runs,
    so an unsupported backward (a backward tile built for another head dim, say) fails before
    any launch.
    """
    needs_grad = torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad for t in (q, k, v))
    if needs_grad and precision == "fp8":
        raise ValueError("custom fp8 is a forward only: it has no backward (run it under torch.no_grad, or on "
                         "inputs that need no gradient)")
    if not needs_grad:
        out, _ = flash_forward(q, k, v, causal, variant, layout=layout, scale=scale, precision=precision,
                               l2_section=l2_section, causal_align=causal_align)
        return out
    if layout not in ("bhld", "blhd"):
        raise ValueError(f"custom kernel: layout {layout!r} not in ('bhld', 'blhd')")
    if layout == "blhd":
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    check_inputs(q, k, v)  # the forward's own refusals first, with its messages
    check_causal_align(causal_align)
    cap = capability(q.device) if q.is_cuda else None  # a wgmma tile needs 9.0
    if deterministic is None:
        deterministic = torch.are_deterministic_algorithms_enabled()
    plan = backward_plan(precision_of(q.dtype, precision), q.shape[-1], backward_tile, cap, deterministic)
    scale = float(scale if scale is not None else 1.0 / math.sqrt(q.shape[-1]))
    out = FlashAttentionFunction.apply(q, k, v, bool(causal), variant, precision, scale, plan, l2_section,
                                       causal_align)
    return out.transpose(1, 2) if layout == "blhd" else out

"""Block functions: attention of one query block against one key/value block, with its LSE:
the form of a backend that the distributed strategies (flashwatt.distributed) compute with.
Which backend has which block, and what each block runs, is declared in
flashwatt.kernels.registry; flashwatt.distributed.blocks.get_block hands them out.

Every block returns (out, lse): out in q's dtype, (B, H, Lq, D); lse the natural-log
sum of exp(scores) per query row, (B, H, Lq), float32 (float64 for the math block). The
ring merges these partial results and, in backward, hands each block the *final* out
and LSE so that its gradient is the block's exact share of the full gradient.

`causal` here is the diagonal block's mask: Lq == Lk and key j visible to query i when
j <= i (top-left aligned). Off-diagonal blocks are either full or skipped by the schedule.

k/v carry Hkv heads (GQA/MQA: H a multiple of Hkv, query head h reads key head
h // (H / Hkv)). The SDPA ops want equal heads, so they get a local expanded copy; the
ring only ever sends the Hkv heads.
"""
from __future__ import annotations

import torch

aten = torch.ops.aten


def _expand_kv(t: torch.Tensor, heads: int) -> torch.Tensor:
    group = heads // t.shape[1]
    return t if group == 1 else t.repeat_interleave(group, dim=1)


def _sequence_major(t: torch.Tensor) -> torch.Tensor:
    """(B, H, L, D) view of a tensor stored (B, L, H, D)-contiguous."""
    return t.transpose(1, 2).contiguous().transpose(1, 2)


def _reduce_kv(grad: torch.Tensor, kv_heads: int) -> torch.Tensor:
    B, H, L, D = grad.shape
    return grad if H == kv_heads else grad.view(B, kv_heads, H // kv_heads, L, D).sum(dim=2)


class MathBlock:
    """Float64 block: the CPU/test path and the reference arithmetic. Exact to float64."""

    name = "math"
    differentiable = True

    def _probs(self, q, k, causal, scale, lse=None):
        B, H, Lq, D = q.shape
        Hkv = k.shape[1]
        q64 = q.double().view(B, Hkv, H // Hkv, Lq, D)
        s = (q64 @ k.double().unsqueeze(2).transpose(-2, -1)) * scale
        if causal:
            mask = torch.ones(Lq, k.shape[2], dtype=torch.bool, device=q.device).triu(1)
            s = s.masked_fill(mask, float("-inf"))
        if lse is None:
            lse = torch.logsumexp(s, dim=-1)
        else:
            lse = lse.double().view(B, Hkv, H // Hkv, Lq)
        return torch.exp(s - lse.unsqueeze(-1)), lse

    def forward(self, q, k, v, causal: bool, scale: float):
        B, H, Lq, D = q.shape
        p, lse = self._probs(q, k, causal, scale)
        out = p @ v.double().unsqueeze(2)
        return out.reshape(B, H, Lq, D).to(q.dtype), lse.reshape(B, H, Lq)

    def backward(self, dout, q, k, v, out, lse, causal: bool, scale: float):
        B, H, Lq, D = q.shape
        Hkv = k.shape[1]
        p, _ = self._probs(q, k, causal, scale, lse)
        do = dout.double().view(B, Hkv, H // Hkv, Lq, D)
        o = out.double().view(B, Hkv, H // Hkv, Lq, D)
        v64 = v.double().unsqueeze(2)
        dv = (p.transpose(-2, -1) @ do).sum(dim=2)
        dp = do @ v64.transpose(-2, -1)
        ds = p * (dp - (do * o).sum(-1, keepdim=True))
        dq = (ds @ k.double().unsqueeze(2)) * scale
        dk = (ds.transpose(-2, -1) @ q.double().view(B, Hkv, H // Hkv, Lq, D)).sum(dim=2) * scale
        return dq.reshape(B, H, Lq, D), dk, dv


class FlashBlock:
    """aten._scaled_dot_product_flash_attention (fp16/bf16, CUDA) and its backward."""

    name = "flash"
    differentiable = True

    def forward(self, q, k, v, causal: bool, scale: float):
        H = q.shape[1]
        out, lse, *_ = aten._scaled_dot_product_flash_attention(
            q, _expand_kv(k, H), _expand_kv(v, H), 0.0, causal, False, scale=scale)
        return out, lse

    def backward(self, dout, q, k, v, out, lse, causal: bool, scale: float):
        H, Hkv = q.shape[1], k.shape[1]
        # Dropout is off: the philox state is never read; the dense (non-varlen) path
        # is chosen by leaving the cumulative-length tensors undefined.
        none = torch.zeros((), dtype=torch.int64, device=q.device)
        dq, dk, dv = aten._scaled_dot_product_flash_attention_backward(
            dout.contiguous(), q, _expand_kv(k, H), _expand_kv(v, H), out.contiguous(), lse.contiguous(),
            None, None, q.shape[2], k.shape[2], 0.0, causal, none, none, scale=scale)
        return dq, _reduce_kv(dk, Hkv), _reduce_kv(dv, Hkv)


class EfficientBlock:
    """aten._scaled_dot_product_efficient_attention (fp32/fp16/bf16, CUDA) and its backward."""

    name = "efficient"
    differentiable = True

    def forward(self, q, k, v, causal: bool, scale: float):
        H, Lq = q.shape[1], q.shape[2]
        out, lse, *_ = aten._scaled_dot_product_efficient_attention(
            q, _expand_kv(k, H), _expand_kv(v, H), None, True, 0.0, causal, scale=scale)
        return out, lse[..., :Lq]  # the kernel pads the LSE rows to a multiple of 32

    def backward(self, dout, q, k, v, out, lse, causal: bool, scale: float):
        H, Hkv, Lq = q.shape[1], k.shape[1], q.shape[2]
        padded = -(-Lq // 32) * 32
        lse_in = torch.zeros(lse.shape[:2] + (padded,), dtype=torch.float32, device=lse.device)
        lse_in[..., :Lq] = lse
        none = torch.zeros((), dtype=torch.int64, device=q.device)
        # out and dout in the layout the forward writes out: (B, L, H, D) in memory. With
        # (B, H, L, D)-contiguous ones the half-precision kernels return wrong dQ and dK
        # (finite, far off; float32 is right), so the merged output is laid out as the
        # kernel's own would be.
        dq, dk, dv, _ = aten._scaled_dot_product_efficient_attention_backward(
            _sequence_major(dout), q, _expand_kv(k, H), _expand_kv(v, H), None, _sequence_major(out), lse_in,
            none, none, 0.0, [True, True, True, False], causal, scale=scale)
        return dq, _reduce_kv(dk, Hkv), _reduce_kv(dv, Hkv)


class CudnnBlock:
    """aten._scaled_dot_product_cudnn_attention (fp16/bf16, CUDA, cuDNN) and its backward."""

    name = "cudnn"
    differentiable = True

    def forward(self, q, k, v, causal: bool, scale: float):
        H = q.shape[1]
        out, lse, *_ = aten._scaled_dot_product_cudnn_attention(
            q, _expand_kv(k, H), _expand_kv(v, H), None, True, 0.0, causal, False, scale=scale)
        return out, lse.reshape(q.shape[:3])  # some versions return (B, H, L, 1)

    def backward(self, dout, q, k, v, out, lse, causal: bool, scale: float):
        H, Hkv = q.shape[1], k.shape[1]
        none = torch.zeros((), dtype=torch.int64, device=q.device)
        ke, ve = _expand_kv(k, H), _expand_kv(v, H)
        dq, dk, dv = aten._scaled_dot_product_cudnn_attention_backward(
            dout.contiguous(), q, ke, ve, out.contiguous(), lse.reshape(q.shape[:3] + (1,)).contiguous(),
            none, none, None, None, None, q.shape[2], k.shape[2], 0.0, causal, scale=scale)
        return dq, _reduce_kv(dk, Hkv), _reduce_kv(dv, Hkv)


class CustomBlock:
    """flashwatt's CUDA kernels: the forward (flashwatt.kernels.custom.flash_forward) and the
    backward from the merged out and LSE (flashwatt.kernels.custom_backward, the plan it
    picks for the precision and head dim: the CUDA kernel for fp16/bf16, the exact PyTorch
    equations for fp32)."""

    name = "custom"
    differentiable = True

    def __init__(self, variant: str = ""):
        self.variant = variant

    def forward(self, q, k, v, causal: bool, scale: float):
        from flashwatt.kernels.custom import flash_forward

        return flash_forward(q, k, v, causal, self.variant, scale=scale)

    def backward(self, dout, q, k, v, out, lse, causal: bool, scale: float):
        from flashwatt.kernels.custom_backward import backward_plan, flash_backward
        from flashwatt.kernels.custom_inputs import capability, precision_of

        plan = backward_plan(precision_of(q.dtype, None), q.shape[-1], capability=capability(q.device),
                             deterministic=torch.are_deterministic_algorithms_enabled())
        return flash_backward(dout, q, k, v, out, lse, causal, scale, plan)

"""The numerics of flashwatt's fp8 (e4m3) attention forward, written in torch so that they run
on the CPU: what the quantisation step computes, the order V^T's keys take, and an emulation
of the kernel's arithmetic tile by tile (kernels/fp8_quantize.cuh, kernels/flash_fwd_fp8.cuh;
kernels/NOTES.md, "fp8 forward").

- `quantize_per_head`: per (batch, head), amax = max |x|, descale = amax / 448 (1 where amax is
  0), x8 = e4m3(x * 448 / amax), rounded to nearest even and saturated at +-448: the CUDA step
  computes the same bits (its scale is the same float32 division, its cast cvt.rn.satfinite).
- `key_of_column`, `transpose_v`: V^T as the kernel reads it (head dim rows, keys padded to a
  multiple of KEY_PAD, each 32 keys permuted so that P needs no shuffle between threads).
- `emulate_attention`: the kernel's forward on e4m3 operands, block of BLOCK_N keys after
  block, online softmax in base 2 with P = 2^(s * scale_log2 - (max - P_SHIFT)) rounded to e4m3,
  the row sum of the unrounded P, O = (P8 V8) * descale_v / sum. It differs from the kernel only
  in summation order and in exp2 (the kernel's ex2.approx), the reference the GPU tests hold
  the kernel to, closer than to float64.

Error against float64 (N(0, 1) inputs): about 2.5-3.5 % relative, from e4m3's 3 mantissa bits
(unit roundoff 2^-4) on Q, K, V and P; bf16 gives about 0.3 %. flashwatt.vocabulary.TOLERANCE
["fp8"] bounds it (tests/test_fp8_numerics.py measures the emulation against that bound).
"""
from __future__ import annotations

import math

import torch

E4M3 = torch.float8_e4m3fn
E4M3_MAX = 448.0
# P is scaled by 2^P_SHIFT before it is rounded: [0, 256] stays below 448, and values down to
# 2^-14 of the row maximum stay normal e4m3 numbers (kPShift in kernels/flash_fwd_fp8.cuh).
P_SHIFT = 8
# V^T rows hold a multiple of this many keys (kFp8KeyPad in kernels/flash_fp8.cuh).
KEY_PAD = 64
# Keys per tile of the fp8 kernels (their block_n).
BLOCK_N = 128


def to_e4m3(x: torch.Tensor) -> torch.Tensor:
    """x rounded to the nearest e4m3 value (ties to even), saturated at +-448."""
    return x.float().clamp(-E4M3_MAX, E4M3_MAX).to(E4M3)


def descale_of(amax: torch.Tensor) -> torch.Tensor:
    """The factor that maps e4m3 values back to the input's scale: amax / 448, 1 where amax is 0."""
    amax = amax.float()
    return torch.where(amax > 0, amax / E4M3_MAX, torch.ones_like(amax))


def quantize_per_head(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(x8, descale): x (B, H, L, D) in e4m3 with one scale per (batch, head), and the float32
    (B, H) descales with x ~ x8 * descale."""
    xf = x.float()
    amax = xf.abs().amax(dim=(2, 3))
    inv = torch.where(amax > 0, E4M3_MAX / amax, torch.ones_like(amax))
    return to_e4m3(xf * inv[:, :, None, None]), descale_of(amax)


def key_of_column(c: int) -> int:
    """The key that column c of a 32-key group of V^T holds (fp8_key_of_column): a thread's
    fp32 accumulators hold columns 2t, 2t+1, 8+2t, 8+2t+1 of each 16, which the k32 A fragment
    of wgmma reads as columns 4t .. 4t+3."""
    return (c & 16) + 2 * ((c & 15) >> 2) + (c & 1) + 8 * ((c >> 1) & 1)


def padded_keys(len_k: int) -> int:
    """Columns of a V^T row: len_k rounded up to KEY_PAD."""
    return -(-len_k // KEY_PAD) * KEY_PAD


def column_keys(len_k: int) -> torch.Tensor:
    """The key each V^T column holds, for padded_keys(len_k) columns."""
    cols = torch.arange(padded_keys(len_k))
    return (cols & ~31) + torch.tensor([key_of_column(c) for c in range(32)])[cols & 31]


def transpose_v(v8: torch.Tensor) -> torch.Tensor:
    """V^T (B, H, D, padded_keys(L)) of an e4m3 v (B, H, L, D): column c of a row holds key
    column_keys(L)[c], zeros past L."""
    B, H, L, D = v8.shape
    padded = torch.zeros((B, H, padded_keys(L), D), dtype=torch.float32, device=v8.device)
    padded[:, :, :L] = v8.float()
    keys = column_keys(L).to(v8.device)
    return padded[:, :, keys].transpose(2, 3).contiguous().to(E4M3)


def visible(len_q: int, len_k: int, causal: bool, causal_align: str, device) -> torch.Tensor | None:
    """(len_q, len_k) bool, key j visible to query i (None: all, no mask)."""
    if not causal:
        return None
    from flashwatt.kernels.custom_mask import causal_visible

    return causal_visible(len_q, len_k, causal_align, device)


def emulate_attention(q8, k8, v8, descale_q, descale_k, descale_v, causal: bool = False, *,
                      causal_align: str = "top_left", scale: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The fp8 kernel's forward on e4m3 operands (module docstring): (out float32 (B, H, Lq, D),
    natural-log LSE (B, H, Lq)). k8, v8 and their descales may have fewer heads (GQA)."""
    B, H, Lq, D = q8.shape
    Lk = k8.shape[2]
    group = H // k8.shape[1]
    kf = k8.float().repeat_interleave(group, dim=1)
    vf = v8.float().repeat_interleave(group, dim=1)
    dk = descale_k.float().repeat_interleave(group, dim=1)
    dv = descale_v.float().repeat_interleave(group, dim=1)
    scale = scale if scale is not None else 1.0 / math.sqrt(D)
    scale_log2 = (scale * math.log2(math.e)) * descale_q.float() * dk  # (B, H), float32 as the kernel's
    mask = visible(Lq, Lk, causal, causal_align, q8.device)
    qf = q8.float()
    row_max = torch.full((B, H, Lq), float("-inf"), device=q8.device)
    row_sum = torch.zeros((B, H, Lq), device=q8.device)
    o = torch.zeros((B, H, Lq, D), device=q8.device)
    for n0 in range(0, Lk, BLOCK_N):
        s = qf @ kf[:, :, n0:n0 + BLOCK_N].transpose(-2, -1)
        if mask is not None:
            s = s.masked_fill(~mask[:, n0:n0 + BLOCK_N], float("-inf"))
        m_new = torch.maximum(row_max, s.amax(dim=-1) * scale_log2[..., None])
        m_sub = torch.where(m_new == float("-inf"), torch.zeros_like(m_new), m_new)
        alpha = torch.exp2(row_max - m_sub)
        p = torch.exp2(s * scale_log2[..., None, None] - (m_sub - P_SHIFT)[..., None])
        row_sum = row_sum * alpha + p.sum(dim=-1)
        o = o * alpha[..., None] + to_e4m3(p).float() @ vf[:, :, n0:n0 + BLOCK_N]
        row_max = m_new
    inv = torch.where(row_sum > 0, 1.0 / row_sum, torch.zeros_like(row_sum))
    out = o * (inv * dv[..., None])[..., None]
    lse = torch.where(row_sum > 0, (row_max - P_SHIFT + torch.log2(row_sum)) * math.log(2.0),
                      torch.full_like(row_sum, float("-inf")))
    return out, lse

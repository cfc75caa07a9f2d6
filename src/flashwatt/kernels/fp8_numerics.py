"""The numerics of flashwatt's fp8 (e4m3) attention forward, written in torch so that they run
on the CPU: what the quantisation step computes, the order V^T's keys take, and an emulation
of the kernel's arithmetic tile by tile (kernels/fp8_quantize.cuh, kernels/flash_fwd_fp8.cuh;
kernels/NOTES.md, "fp8 forward").

- `quantize_blocks`: one scale per block of rows of each (batch, head): Q_BLOCK (64) query rows,
  KV_BLOCK (128) keys, the rows one consumer warpgroup holds and the keys of one K/V tile, so
  that the quantisation reads each input once (no pass over a whole head for its maximum first)
  and the kernel applies a block's scale where it meets the block. Per block: amax = max |x|,
  descale = amax / 448 and scale = 448 / amax, each the float32 division rounded to nearest
  (1 and 1 where amax is 0; the scale at most float32's largest value), x8 = e4m3(x * scale),
  the product in float32, rounded to nearest even and saturated at +-448: the CUDA step
  computes the same bits (`__fdiv_rn`, `__fmul_rn`, cvt.rn.satfinite). The divisions are written as float64 ones rounded to float32, which is the
  float32 division on any device (float64 has more than 2 * 24 + 2 bits: the double rounding is
  innocuous) where torch's own float32 `a / 448` on a GPU is a multiplication by 1 / 448.
- `key_of_column`, `transpose_v`: V^T as the kernel reads it (head dim rows, keys padded to a
  multiple of KEY_PAD, each 32 keys permuted so that P needs no shuffle between threads).
- `emulate_attention`: the kernel's forward on e4m3 operands, block of BLOCK_N keys after
  block, online softmax in base 2 with P = 2^(s * scale_log2 - (max - P_SHIFT)) rounded to e4m3,
  the row sum of the unrounded P, O = sum_j (P8_j V8_j) descale_v_j / sum. It differs from the
  kernel only in summation order, in exp2 (the kernel's ex2.approx) and in float32 roundings of
  the scales, the reference the GPU tests hold the kernel to, closer than to float64.

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
# V^T has this many rows under the head dim's: ones, then zeros (kFp8VtExtraRows): P V over
# them is P's row sum, on the tensor cores, for the tiles that take it from there.
VT_EXTRA_ROWS = 8
# Keys per tile of the fp8 kernels (their block_n).
BLOCK_N = 128
# Rows per scale (kFp8QBlock, kFp8KvBlock in kernels/flash_fp8.cuh): a consumer warpgroup's
# query rows, a K/V tile's keys.
Q_BLOCK = 64
KV_BLOCK = BLOCK_N


def to_e4m3(x: torch.Tensor) -> torch.Tensor:
    """x rounded to the nearest e4m3 value (ties to even), saturated at +-448."""
    return x.float().clamp(-E4M3_MAX, E4M3_MAX).to(E4M3)


def _f32_div(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a / b of float32 values rounded to nearest in float32, the same bits on every device."""
    return (a.double() / b.double()).float()


def descale_of(amax: torch.Tensor) -> torch.Tensor:
    """The factor that maps e4m3 values back to the input's scale: amax / 448, 1 where amax is 0."""
    amax = amax.float()
    return torch.where(amax > 0, _f32_div(amax, torch.full_like(amax, E4M3_MAX)), torch.ones_like(amax))


def scale_of(amax: torch.Tensor) -> torch.Tensor:
    """The factor the inputs are multiplied by before the cast: 448 / amax, 1 where amax is 0,
    and float32's largest value where the quotient overflows (amax below 448 / 3.4e38: an
    infinite scale would turn the block's zeros into NaN)."""
    amax = amax.float()
    safe = torch.where(amax > 0, amax, torch.ones_like(amax))
    scale = _f32_div(torch.full_like(amax, E4M3_MAX), safe).clamp(max=torch.finfo(torch.float32).max)
    return torch.where(amax > 0, scale, torch.ones_like(amax))


def blocks(length: int, rows: int) -> int:
    """Blocks of `rows` rows that cover `length` rows."""
    return -(-length // rows)


def quantize_blocks(x: torch.Tensor, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(x8, descale): x (B, H, L, D) in e4m3 with one scale per block of `rows` rows of each
    (batch, head) (the last block may be shorter), and the float32 (B, H, blocks(L, rows))
    descales with x[:, :, i] ~ x8[:, :, i] * descale[:, :, i // rows]."""
    B, H, L, D = x.shape
    n = blocks(L, rows)
    xf = x.float()
    padded = torch.zeros((B, H, n * rows, D), dtype=torch.float32, device=x.device)
    padded[:, :, :L] = xf
    amax = padded.abs().view(B, H, n, rows * D).amax(dim=-1)
    scale = scale_of(amax).repeat_interleave(rows, dim=2)[:, :, :L]
    return to_e4m3(xf * scale[..., None]), descale_of(amax)


def quantize_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """[(q8, descale_q), (k8, descale_k), (v8, descale_v)] at the kernel's blocks."""
    return [quantize_blocks(q, Q_BLOCK), quantize_blocks(k, KV_BLOCK), quantize_blocks(v, KV_BLOCK)]


def per_row(descale: torch.Tensor, rows: int, length: int) -> torch.Tensor:
    """Block descales (B, H, n) spread over the rows they scale: (B, H, length)."""
    return descale.float().repeat_interleave(rows, dim=2)[:, :, :length]


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
    """V^T (B, H, D + VT_EXTRA_ROWS, padded_keys(L)) of an e4m3 v (B, H, L, D): column c of row
    d < D holds key column_keys(L)[c] (zeros past L), row D ones, the rows after it zeros."""
    B, H, L, D = v8.shape
    padded = torch.zeros((B, H, padded_keys(L), D + VT_EXTRA_ROWS), dtype=torch.float32, device=v8.device)
    padded[:, :, :L, :D] = v8.float()
    padded[:, :, :, D] = 1.0
    keys = column_keys(L).to(v8.device)
    return padded[:, :, keys].transpose(2, 3).contiguous().to(E4M3)


def visible(len_q: int, len_k: int, causal: bool, causal_align: str, device) -> torch.Tensor | None:
    """(len_q, len_k) bool, key j visible to query i (None: all, no mask)."""
    if not causal:
        return None
    from flashwatt.kernels.custom_mask import causal_visible

    return causal_visible(len_q, len_k, causal_align, device)


def emulate_attention(q8, k8, v8, descale_q, descale_k, descale_v, causal: bool = False, *,
                      causal_align: str = "top_left", scale: float | None = None,
                      sum_of_rounded_p: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """The fp8 kernel's forward on e4m3 operands (module docstring): (out float32 (B, H, Lq, D),
    natural-log LSE (B, H, Lq)). Descales per block (quantize_blocks: (B, H, blocks) at Q_BLOCK
    query rows and KV_BLOCK keys); k8, v8 and their descales may have fewer heads (GQA).
    sum_of_rounded_p: the row sum of P as rounded to e4m3 (the tiles that sum P on the tensor
    cores, with the ones under V^T) rather than of P before rounding."""
    B, H, Lq, D = q8.shape
    Lk = k8.shape[2]
    group = H // k8.shape[1]
    kf = k8.float().repeat_interleave(group, dim=1)
    vf = v8.float().repeat_interleave(group, dim=1)
    dk = descale_k.float().repeat_interleave(group, dim=1)
    dv = descale_v.float().repeat_interleave(group, dim=1)
    scale = scale if scale is not None else 1.0 / math.sqrt(D)
    # float32 as the kernel's: (scale * log2 e) * descale_q of the row's block, times the tile's descale_k
    base = torch.tensor(scale, dtype=torch.float32) * torch.tensor(math.log2(math.e), dtype=torch.float32)
    q_log2 = base * per_row(descale_q, Q_BLOCK, Lq)  # (B, H, Lq)
    mask = visible(Lq, Lk, causal, causal_align, q8.device)
    qf = q8.float()
    row_max = torch.full((B, H, Lq), float("-inf"), device=q8.device)
    row_sum = torch.zeros((B, H, Lq), device=q8.device)
    o = torch.zeros((B, H, Lq, D), device=q8.device)
    for j, n0 in enumerate(range(0, Lk, BLOCK_N)):
        scale_log2 = q_log2 * dk[:, :, j, None]
        s = qf @ kf[:, :, n0:n0 + BLOCK_N].transpose(-2, -1)
        if mask is not None:
            s = s.masked_fill(~mask[:, n0:n0 + BLOCK_N], float("-inf"))
        m_new = torch.maximum(row_max, s.amax(dim=-1) * scale_log2)
        m_sub = torch.where(m_new == float("-inf"), torch.zeros_like(m_new), m_new)
        alpha = torch.exp2(row_max - m_sub)
        p = torch.exp2(s * scale_log2[..., None] - (m_sub - P_SHIFT)[..., None])
        p8 = to_e4m3(p).float()
        row_sum = row_sum * alpha + (p8 if sum_of_rounded_p else p).sum(dim=-1)
        pv = p8 @ vf[:, :, n0:n0 + BLOCK_N]
        o = o * alpha[..., None] + pv * dv[:, :, j, None, None]
        row_max = m_new
    inv = torch.where(row_sum > 0, 1.0 / row_sum, torch.zeros_like(row_sum))
    out = o * inv[..., None]
    lse = torch.where(row_sum > 0, (row_max - P_SHIFT + torch.log2(row_sum)) * math.log(2.0),
                      torch.full_like(row_sum, float("-inf")))
    return out, lse

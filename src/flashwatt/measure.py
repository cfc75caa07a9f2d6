"""Correctness and timing of one attention cell. Knows nothing of Snakemake or Slurm.

Conventions (docs/measurement.md): seeded random inputs, never zeros; the output compared
with a float64 reference by ||out - ref|| / ||ref||; warm-up first; CUDA events around
each call with the median reported; input sets rotated when one set would sit in L2.
"""
from __future__ import annotations

import contextlib
import dataclasses
import math
import time
from dataclasses import dataclass
from typing import Callable

import torch

from flashwatt.kernels.call import AttentionCall
from flashwatt.vocabulary import STORED_AS, TOLERANCE

# The dtype a cell's inputs are made in: fp8 cells take bf16 inputs, as a user hands them over,
# and quantise them in the call (flashwatt.kernels.custom_fp8).
DTYPES = {"fp32": torch.float32, "tf32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16,
          "fp8": torch.bfloat16}

# Input sets cycled during timing: enough that their bytes exceed the L2 this many times.
L2_MULTIPLE = 4
MAX_INPUT_SETS = 32


@contextlib.contextmanager
def precision_mode(cell: AttentionCall):
    """fp32 cells run real fp32; tf32 cells opt in to tf32 tensor cores; restored afterwards."""
    matmul, cudnn = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    tf32 = cell.precision == "tf32"
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = matmul, cudnn


def input_bytes(cell: AttentionCall, kv_heads: int | None = None) -> int:
    """Bytes of one (q, k, v) set; k and v with `kv_heads` heads where given."""
    elem = torch.empty((), dtype=DTYPES[cell.precision]).element_size()
    return (cell.heads + 2 * (kv_heads or cell.heads)) * cell.batch * cell.seq_len * cell.head_dim * elem


def input_sets_needed(cell: AttentionCall, device: torch.device, kv_heads: int | None = None) -> int:
    if device.type != "cuda":
        return 1
    l2 = getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 50 * 2**20)
    return max(1, min(MAX_INPUT_SETS, math.ceil(L2_MULTIPLE * l2 / input_bytes(cell, kv_heads))))


def make_inputs(cell: AttentionCall, device: torch.device, seed: int, sets: int,
                kv_heads: int | None = None) -> list[tuple[torch.Tensor, ...]]:
    """`sets` independent (q, k, v) triples drawn from N(0, 1) under `seed`; k and v with
    `kv_heads` heads where given (grouped-query attention), the cell's heads otherwise."""
    gen = torch.Generator(device=device).manual_seed(seed)
    shape = (cell.batch, cell.heads, cell.seq_len, cell.head_dim)
    shapes = (shape, *[(cell.batch, kv_heads or cell.heads, cell.seq_len, cell.head_dim)] * 2)
    dtype = DTYPES[cell.precision]
    grad = cell.pass_ == "fwd_bwd"
    out = []
    for _ in range(sets):
        triple = tuple(
            torch.randn(s, generator=gen, device=device, dtype=torch.float32).to(dtype).requires_grad_(grad)
            for s in shapes
        )
        out.append(triple)
    return out


def make_call(kernel, cell: AttentionCall, inputs, dout=None) -> Callable[[int], object]:
    """call(i) runs the cell's pass once on input set i % len(inputs)."""
    if cell.pass_ == "fwd":
        def call(i: int):
            q, k, v = inputs[i % len(inputs)]
            return kernel(q, k, v, cell)
    else:
        def call(i: int):
            q, k, v = inputs[i % len(inputs)]
            out = kernel(q, k, v, cell)
            return torch.autograd.grad(out, (q, k, v), dout)
    return call


# ---- correctness --------------------------------------------------------------------
def check_rows(seq_len: int, max_rows: int) -> torch.Tensor:
    """Query rows to check: all of them, or an even spread that includes both ends."""
    if seq_len <= max_rows:
        return torch.arange(seq_len)
    return torch.linspace(0, seq_len - 1, max_rows).round().long().unique()


def reference_attention(q, k, v, causal: bool, rows: torch.Tensor | None = None) -> torch.Tensor:
    """softmax(q kᵀ/√d) v in float64 for the chosen query rows (all keys)."""
    q, k, v = q.double(), k.double(), v.double()
    L = k.shape[-2]
    rows = torch.arange(q.shape[-2]) if rows is None else rows
    rows = rows.to(q.device)
    scores = q[..., rows, :] @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if causal:
        keys = torch.arange(L, device=q.device)
        scores = scores.masked_fill(keys[None, :] > rows[:, None], float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


def relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    out = out.double()
    if not torch.isfinite(out).all():
        return float("nan")
    return float(torch.linalg.vector_norm(out - ref) / torch.linalg.vector_norm(ref))


@dataclass(frozen=True)
class Check:
    rel_err: float
    tol: float
    grad_rel_err: float | None
    grad_tol: float | None
    rows_checked: int
    heads_checked: int
    finite: bool
    # A precision stored as another (vocabulary.STORED_AS: fp8 from bf16 inputs): the error of
    # that precision's run of the same kernel on the same inputs and rows, for the ladder.
    rel_err_bf16_same_inputs: float | None = None

    @property
    def passed(self) -> bool:
        ok = self.finite and self.rel_err <= self.tol  # NaN compares False: never passes
        if self.grad_tol is not None:
            ok = ok and self.grad_rel_err is not None and self.grad_rel_err <= self.grad_tol
        return bool(ok)

    def as_dict(self) -> dict:
        return {**self.__dict__, "passed": self.passed}


def check_cell(kernel, cell: AttentionCall, q, k, v, max_rows: int, seed: int) -> Check:
    """Run the cell once and compare against float64: batch 0, up to two heads, a spread of rows.
    A precision stored as another (fp8: bf16 inputs) also runs the kernel at that precision on
    the same inputs, and records its error beside its own."""
    tol = TOLERANCE[cell.precision]
    if cell.pass_ == "fwd":
        with torch.no_grad():
            out = kernel(q, k, v, cell)
    else:
        out = kernel(q, k, v, cell)
    finite = bool(torch.isfinite(out).all())
    heads = min(cell.heads, 2)
    rows = check_rows(cell.seq_len, max_rows)
    with torch.no_grad():
        ref = reference_attention(q[0, :heads], k[0, :heads], v[0, :heads], cell.causal, rows)
        rel = relative_error(out[0, :heads][:, rows.to(out.device)], ref)
        stored_rel = None
        if cell.precision in STORED_AS:
            stored = dataclasses.replace(cell, precision=STORED_AS[cell.precision], variant="")
            stored_out = kernel(q, k, v, stored)
            stored_rel = relative_error(stored_out[0, :heads][:, rows.to(out.device)], ref)
            del stored_out
    grad_rel = grad_tol = None
    if cell.pass_ == "fwd_bwd":
        grad_tol = tol["grad"]
        gen = torch.Generator(device=q.device).manual_seed(seed + 1)
        dout = torch.randn(out.shape, generator=gen, device=q.device, dtype=torch.float32).to(out.dtype)
        grads = torch.autograd.grad(out, (q, k, v), dout)
        finite = finite and all(bool(torch.isfinite(g).all()) for g in grads)
        # Gradients of K and V depend on every query row: check batch 0, head 0, in full.
        q64, k64, v64 = (t[0, 0].detach().double().requires_grad_(True) for t in (q, k, v))
        ref_out = reference_attention(q64, k64, v64, cell.causal)
        ref_grads = torch.autograd.grad(ref_out, (q64, k64, v64), dout[0, 0].double())
        grad_rel = max(relative_error(g[0, 0], r) for g, r in zip(grads, ref_grads))
    return Check(rel, tol["fwd"], grad_rel, grad_tol, int(rows.numel()), heads, finite, stored_rel)


# ---- timing --------------------------------------------------------------------------
def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def warm_up(call: Callable[[int], object], device: torch.device, warmup_ms: float) -> float:
    """Run calls for at least `warmup_ms`; return the estimated seconds per call."""
    _sync(device)
    t0 = time.perf_counter()
    n = 0
    while True:
        call(n)
        n += 1
        if n in (1, 2, 4) or n % 8 == 0:
            _sync(device)
            if (time.perf_counter() - t0) * 1e3 >= warmup_ms and n >= 2:
                break
    _sync(device)
    return (time.perf_counter() - t0) / n


def peak_memory(call, device: torch.device) -> dict:
    """Bytes held at the peak of one call, and what the call added above its inputs."""
    if device.type != "cuda":
        return {"peak_bytes": None, "workspace_bytes": None}
    _sync(device)
    torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device)
    call(0)
    _sync(device)
    peak = torch.cuda.max_memory_allocated(device)
    return {"peak_bytes": int(peak), "workspace_bytes": int(peak - before)}


def is_oom(err: BaseException) -> bool:
    """An allocation the device refused: CUDA's out-of-memory, or the CPU allocator's."""
    if isinstance(err, (torch.OutOfMemoryError, MemoryError)):
        return True
    text = str(err).lower()
    # torch's CPU allocator raises a plain RuntimeError: "DefaultCPUAllocator: can't allocate memory"
    return "out of memory" in text or "can't allocate memory" in text

"""PyTorch SDPA with exactly one backend allowed, and PyTorch's own default.

`sdpa_kernel([backend])` makes PyTorch raise instead of falling back to another backend,
so a result labelled `sdpa_flash` was computed by the flash backend. `sdpa_default`
forces nothing: it is the baseline a PyTorch user gets from a plain call (on an H100 with
PyTorch 2.11, cuDNN's kernel for bf16). When the backend
refuses a cell, PyTorch's own reason (its warnings plus the error) becomes the
"skipped" record's reason, via `UnsupportedCell`.
"""
from __future__ import annotations

import contextlib
import warnings

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from flashwatt.attention.cell import Cell
from flashwatt.kernels.base import UnsupportedCell


class ForcedSdpa:
    differentiable = True

    def __init__(self, name: str, backend: SDPBackend | None, cuda_only: bool, half_only: bool):
        self.name = name
        self.backend = backend
        self.cuda_only = cuda_only
        self.half_only = half_only

    def supports(self, cell: Cell, device: torch.device) -> str | None:
        if self.cuda_only and device.type != "cuda":
            return f"{self.name} needs a CUDA device (running on {device.type})"
        if self.half_only and cell.precision not in ("fp16", "bf16"):
            return f"{self.name} runs fp16/bf16 only (cell asks for {cell.precision})"
        if device.type == "cpu" and cell.precision != "fp32":
            return f"{self.name} on CPU is measured in fp32 only (cell asks for {cell.precision})"
        return None

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cell: Cell) -> torch.Tensor:
        forced = sdpa_kernel([self.backend]) if self.backend is not None else contextlib.nullcontext()
        with warnings.catch_warnings(record=True) as caught, forced:
            warnings.simplefilter("always")
            try:
                if k.shape[1] != q.shape[1]:  # grouped-query attention: the backend's own path
                    return F.scaled_dot_product_attention(q, k, v, is_causal=cell.causal, enable_gqa=True)
                return F.scaled_dot_product_attention(q, k, v, is_causal=cell.causal)
            except RuntimeError as err:
                if "No available kernel" not in str(err):
                    raise
                why = "; ".join(str(w.message).strip() for w in caught) or str(err)
                raise UnsupportedCell(f"{self.name}: PyTorch refused the cell: {why}") from err


SDPA_KERNELS = (
    ForcedSdpa("sdpa_math", SDPBackend.MATH, cuda_only=False, half_only=False),
    ForcedSdpa("sdpa_flash", SDPBackend.FLASH_ATTENTION, cuda_only=True, half_only=True),
    ForcedSdpa("sdpa_efficient", SDPBackend.EFFICIENT_ATTENTION, cuda_only=True, half_only=False),
    ForcedSdpa("sdpa_cudnn", SDPBackend.CUDNN_ATTENTION, cuda_only=True, half_only=True),
    ForcedSdpa("sdpa_default", None, cuda_only=False, half_only=False),
)

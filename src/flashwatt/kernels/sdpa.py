"""PyTorch SDPA with exactly one backend allowed, and PyTorch's own default.

`sdpa_kernel([backend])` makes PyTorch raise instead of falling back to another backend,
so a result labelled `sdpa_flash` was computed by the flash backend. `sdpa_default`
forces nothing: it is the baseline a PyTorch user gets from a plain call (on an H100 with
PyTorch 2.11, cuDNN's kernel for bf16). When the backend
refuses a call, PyTorch's own reason (its warnings plus the error) becomes the
"skipped" record's reason, via `UnsupportedCell`. What each one runs (precisions, CUDA
only or the CPU too) is declared in flashwatt.kernels.registry.
"""
from __future__ import annotations

import contextlib
import warnings
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from flashwatt.kernels.base import UnsupportedCell

if TYPE_CHECKING:
    from flashwatt.kernels.call import AttentionCall


class ForcedSdpa:
    def __init__(self, name: str, backend: SDPBackend | None):
        self.name = name
        self.backend = backend

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, call: "AttentionCall") -> torch.Tensor:
        forced = sdpa_kernel([self.backend]) if self.backend is not None else contextlib.nullcontext()
        with warnings.catch_warnings(record=True) as caught, forced:
            warnings.simplefilter("always")
            try:
                if k.shape[1] != q.shape[1]:  # grouped-query attention: the backend's own path
                    return F.scaled_dot_product_attention(q, k, v, is_causal=call.causal, enable_gqa=True)
                return F.scaled_dot_product_attention(q, k, v, is_causal=call.causal)
            except RuntimeError as err:
                if "No available kernel" not in str(err):
                    raise
                why = "; ".join(str(w.message).strip() for w in caught) or str(err)
                raise UnsupportedCell(f"{self.name}: PyTorch refused the cell: {why}") from err


SDPA_MATH = ForcedSdpa("sdpa_math", SDPBackend.MATH)
SDPA_FLASH = ForcedSdpa("sdpa_flash", SDPBackend.FLASH_ATTENTION)
SDPA_EFFICIENT = ForcedSdpa("sdpa_efficient", SDPBackend.EFFICIENT_ATTENTION)
SDPA_CUDNN = ForcedSdpa("sdpa_cudnn", SDPBackend.CUDNN_ATTENTION)
SDPA_DEFAULT = ForcedSdpa("sdpa_default", None)

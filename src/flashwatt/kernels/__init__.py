"""Attention backends, all behind the contract in `base.Kernel`, declared once in `registry`.

    get_kernel(name)(q, k, v, call)    an attention call through a backend
    get_kernel(name).supports(call, device)    why it cannot run a call, or None

Torch-free at import: a backend's implementation is imported when first asked for.
"""
from __future__ import annotations

from flashwatt.kernels.declaration import Backend, Block, DeclaredKernel
from flashwatt.kernels.base import Kernel, UnsupportedCell
from flashwatt.kernels.call import AttentionCall
from flashwatt.kernels.registry import backend, get_kernel, kernel_names, register

__all__ = ["AttentionCall", "Backend", "Block", "DeclaredKernel", "Kernel", "KERNEL_NAMES", "UnsupportedCell",
           "backend", "get_kernel", "register"]


def __getattr__(name: str):
    # Derived when asked for, not at import: importing this package (on the way to the
    # registry) must leave `register` open (flashwatt.kernels.registry).
    if name == "KERNEL_NAMES":
        return kernel_names()
    raise AttributeError(name)

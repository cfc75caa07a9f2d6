"""Registry of attention backends, all behind the contract in `base.Kernel`."""
from __future__ import annotations

from flashwatt.kernels.base import Kernel
from flashwatt.vocabulary import KERNEL_NAMES


def get_kernel(name: str) -> Kernel:
    """Import lazily so that config validation and the DAG never import torch."""
    if name == "naive":
        from flashwatt.kernels.naive import Naive

        return Naive()
    if name.startswith("sdpa_"):
        from flashwatt.kernels.sdpa import SDPA_KERNELS

        for kernel in SDPA_KERNELS:
            if kernel.name == name:
                return kernel
    if name == "custom":
        from flashwatt.kernels.custom import Custom

        return Custom()
    raise KeyError(f"unknown kernel {name!r}; allowed: {', '.join(KERNEL_NAMES)}")

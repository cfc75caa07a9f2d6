"""Which GPUs this process may use, found without importing torch or NVML.

The DAG is built on login nodes and laptops: it must not pay for a torch import or
require a driver just to decide which suite `auto` means or how many cells may run.
"""
from __future__ import annotations

import os
import shutil
import subprocess


def visible_gpu_ids() -> list[str]:
    """CUDA device ids this process may use: CUDA_VISIBLE_DEVICES if set, else nvidia-smi's list."""
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        ids = [d.strip() for d in env.split(",") if d.strip()]
        # CUDA stops at the first invalid entry; "-1" or "" hides every device.
        valid = []
        for d in ids:
            if d.startswith("-"):
                break
            valid.append(d)
        return valid
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return []
    try:
        out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=20, check=False).stdout
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [str(i) for i, line in enumerate(l for l in out.splitlines() if l.startswith("GPU "))]


def visible_gpu_count() -> int:
    return len(visible_gpu_ids())

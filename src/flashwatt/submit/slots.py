"""GPU slot locks: how the local executor keeps one cell per GPU on this machine.

Each job holds one lock file per GPU it uses (FLASHWATT_SLOT_DIR, default
results/.slots) and sees only those GPUs; a machine without a GPU has one "cpu" slot,
so CPU timings never overlap. The locks are OS-level (filelock), so a killed job frees
its slots.
"""
from __future__ import annotations

import contextlib
import os
import re
import time
from pathlib import Path
from typing import Iterator

from filelock import FileLock, Timeout

from flashwatt.devices import visible_gpu_ids

DEFAULT_SLOT_DIR = "results/.slots"


def slot_dir() -> Path:
    return Path(os.environ.get("FLASHWATT_SLOT_DIR", DEFAULT_SLOT_DIR))


def _lock_file(folder: Path, name: str) -> Path:
    # GPU names may be UUIDs or MIG ids; keep the file name portable.
    return folder / f"{re.sub(r'[^A-Za-z0-9_.-]', '_', name)}.lock"


class TooFewGpus(ValueError):
    """A job asks for more GPUs than this machine shows: it could never start here."""


class OneNodeOnly(TooFewGpus):
    """A job spans several nodes, and the local executor has this machine only."""
# The reason a skipped record gives for a cell asking for more GPUs than the machine shows.
TOO_FEW_GPUS_REASON = "cell asks for more GPUs than this machine has ({})"


def gpu_shortage(count: int, gpus: list[str]) -> str | None:
    """Why a job asking for `count` GPUs can never start on a machine showing `gpus` (none:
    one CPU slot, which any job may take), or None when it can."""
    names = gpus or ["cpu"]
    count = max(1, count) if gpus else 1
    if count > len(names):
        return f"job asks for {count} GPUs; this machine shows {len(names)}: {', '.join(names)}"
    return None


@contextlib.contextmanager
def gpu_slots(count: int = 1, poll_s: float = 0.5) -> Iterator[list[str]]:
    """Hold `count` free slot locks (one per GPU, or the one "cpu" slot) and yield their GPUs.

    Yields [] when the machine has no GPU. Slots are taken all at once or not at all,
    so two multi-GPU jobs never deadlock holding half each.
    """
    gpus = visible_gpu_ids()
    shortage = gpu_shortage(count, gpus)
    if shortage is not None:
        raise TooFewGpus(shortage)
    names = gpus or ["cpu"]
    count = max(1, count) if gpus else 1
    folder = slot_dir()
    folder.mkdir(parents=True, exist_ok=True)
    locks = {name: FileLock(str(_lock_file(folder, name))) for name in names}
    held: list[str] = []
    try:
        while True:
            for name in names:
                if len(held) == count:
                    break
                try:
                    locks[name].acquire(timeout=0)
                    held.append(name)
                except Timeout:
                    pass
            if len(held) == count:
                break
            for name in held:  # all or nothing
                locks[name].release()
            held = []
            time.sleep(poll_s)
        yield held if gpus else []
    finally:
        for name in held:
            locks[name].release()

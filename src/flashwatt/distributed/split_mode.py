"""Run only the communication or only the computation of a schedule, to time each share.

"full" (the default) is the real attention. "comm_only" posts every transfer of the
schedule (ring steps, dK/dV returns, all-to-alls) with no block compute; "compute_only"
runs every block of the schedule with no transfer (each rank reuses the tensors it has,
so the arithmetic and its shapes are the same). Their outputs are meaningless: they are
for timing only. With t_full, t_comm, t_compute the times of the three, the exposed
communication is t_full - t_compute and the hidden part is t_comm - (t_full - t_compute).
"""
from __future__ import annotations

import contextlib

MODES = ("full", "comm_only", "compute_only")
_mode = ["full"]


def current() -> str:
    return _mode[0]


@contextlib.contextmanager
def split_mode(mode: str):
    if mode not in MODES:
        raise ValueError(f"unknown split mode {mode!r}; allowed: {', '.join(MODES)}")
    previous, _mode[0] = _mode[0], mode
    try:
        yield
    finally:
        _mode[0] = previous


def communicate() -> bool:
    return _mode[0] != "compute_only"


def compute() -> bool:
    return _mode[0] != "comm_only"

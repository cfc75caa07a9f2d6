"""Rank 0's work alone, and the other ranks' wait for its result.

Some phases of a cell run on rank 0 only: the float64 reference of a distributed cell's
check, the whole problem on one GPU (its timing and energy window), a model cell's
one-process check. The other ranks wait for the result, and that wait can last far longer
than any collective of the cell should: over NCCL the watchdog would end them at the
process group's timeout (the 128k attention cells on two H100s were ended so, rank 0
still in its check). So they wait on a gloo group of their own, on the host where no NCCL
watchdog looks, whose timeout is the failure policy's `solo_phase_timeout_s` (config key
`ranks.solo_phase_timeout_s`, 600 s by default). Rank 0 dying in such a phase still ends
the cell at once (the rank supervisor sees its exit); rank 0 hanging in one ends it after
that timeout.

    open_group()             every rank, right after the default process group starts
    value = from_rank_zero(value)   every rank: rank 0's value on all of them
    forget()                 once the default process group is gone
"""
from __future__ import annotations

import datetime

import torch.distributed as dist

_GROUPS: dict = {}


def open_group() -> None:
    """Collective: the gloo group the waits run on, for this process's default group."""
    from flashwatt.submit.failure_policy import FailurePolicy

    timeout = datetime.timedelta(seconds=FailurePolicy.from_environment().solo_phase_timeout_s)
    _GROUPS[dist.group.WORLD] = dist.new_group(backend="gloo", timeout=timeout)


def from_rank_zero(value):
    """Collective: rank 0's `value` on every rank, waited for on the rank-0 group (module
    docstring); a process group opened without one waits on the default group."""
    box = [value]
    dist.broadcast_object_list(box, src=0, group=_GROUPS.get(dist.group.WORLD))
    return box[0]


def forget() -> None:
    """Drop the groups of this process's default group, once that group is destroyed."""
    _GROUPS.clear()

"""Communication: K/V (and dK/dV) passed one step around a ring, and the Ulysses all-to-all.

Ring steps post a `batch_isend_irecv` (send to the next rank, receive from the previous)
before the step's block computation and wait for it after, so the transfer runs under
the compute. Every tensor is sent as it is (K/V with their own Hkv heads).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class Ring:
    """A ring over a process group: this rank's place and its neighbours' global ranks.

    size 1 (group None) is a ring of one: no communication at all."""

    group: object
    rank: int
    size: int

    @classmethod
    def of(cls, group) -> "Ring":
        if group is None:
            return cls(None, 0, 1)
        return cls(group, dist.get_rank(group), dist.get_world_size(group))

    def global_rank(self, group_rank: int) -> int:
        return dist.get_global_rank(self.group, group_rank % self.size)

    def origin(self, step: int) -> int:
        """The group rank whose K/V this rank holds at `step`."""
        return (self.rank - step) % self.size


class Pending:
    """Posted transfers; `wait()` returns the received tensors."""

    def __init__(self, requests, received):
        self.requests, self.received = requests, received

    def wait(self) -> list[torch.Tensor]:
        for req in self.requests:
            req.wait()
        return self.received


def pass_on(ring: Ring, tensors: list[torch.Tensor]) -> Pending:
    """Send `tensors` to the next rank and receive the previous rank's, asynchronously."""
    tensors = [t.contiguous() for t in tensors]
    received = [torch.empty_like(t) for t in tensors]
    nxt, prv = ring.global_rank(ring.rank + 1), ring.global_rank(ring.rank - 1)
    ops = [dist.P2POp(dist.isend, t, nxt, ring.group) for t in tensors]
    ops += [dist.P2POp(dist.irecv, r, prv, ring.group) for r in received]
    return Pending(dist.batch_isend_irecv(ops), received)


def all_to_all(x: torch.Tensor, group) -> torch.Tensor:
    """x (W, ...) contiguous: slice i goes to group rank i; returns slices by source rank."""
    out = torch.empty_like(x)
    dist.all_to_all_single(out, x.contiguous(), group=group)
    return out

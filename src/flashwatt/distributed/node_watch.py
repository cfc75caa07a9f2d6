"""What the rank supervisors of a cell over several nodes tell each other.

Each node's job task supervises its own ranks (flashwatt.distributed.rank_supervisor). A
rank that fails on one node must end the ranks of every node, and the record, written on
the first node, must say which rank it was. The supervisors share a c10d TCPStore (the
first node's supervisor hosts it, on the port after the ranks' own):

    abort          set by the first supervisor whose ranks ended badly (its node number)
    ended/<node>   each node's ranks' fates, once they have all ended

Every supervisor looks at `abort` between its polls and stops its ranks when it is set; the
first node waits for every other node's `ended/<node>` before it writes the record (and
before it closes the store), at most the failure policy's bound. A supervisor that
cannot reach the store any more takes it as an abort: the first node's task is gone.

A cell on one node has nothing to tell: `NodeWatch.alone()` answers for it.
"""
from __future__ import annotations

import json
import time
from dataclasses import asdict

from flashwatt.distributed.rank_fate import RankFate

POLL_S = 0.2


class NodeWatch:
    def __init__(self, layout, store=None):
        self.layout = layout
        self.store = store

    @classmethod
    def alone(cls, layout) -> "NodeWatch":
        return cls(layout)

    @classmethod
    def over_store(cls, layout, timeout) -> "NodeWatch":
        from torch.distributed import TCPStore

        store = TCPStore(layout.addr, layout.port + 1, layout.nodes, is_master=layout.node == 0, timeout=timeout,
                         wait_for_workers=False)
        return cls(layout, store)

    def abort_seen(self) -> str | None:
        """Why this node must stop its ranks (another node's failure), or None."""
        if self.store is None:
            return None
        try:
            if self.store.check(["abort"]):
                return f"node {self.store.get('abort').decode()} reported a failed rank"
        except Exception as error:  # the first node's store is gone with its task
            return f"the first node's supervisor cannot be reached ({type(error).__name__}: {error})"
        return None

    def tell_abort(self) -> None:
        if self.store is not None:
            try:
                if not self.store.check(["abort"]):
                    self.store.set("abort", str(self.layout.node))
            except Exception:
                pass  # the others end through their collective timeout instead

    def tell_ended(self, fates: list[RankFate]) -> None:
        if self.store is not None:
            try:
                self.store.set(f"ended/{self.layout.node}", json.dumps([asdict(f) for f in fates]))
            except Exception:
                pass

    def other_nodes(self, timeout_s: float) -> tuple[list[RankFate], list[int]]:
        """On the first node: every other node's fates, waiting up to `timeout_s` for them;
        and the nodes that never said."""
        if self.store is None or self.layout.node != 0:
            return [], []
        waiting = set(range(1, self.layout.nodes))
        fates: list[RankFate] = []
        deadline = time.monotonic() + timeout_s
        while waiting and time.monotonic() < deadline:
            for node in sorted(waiting):
                if self.store.check([f"ended/{node}"]):
                    fates += [RankFate(**f) for f in json.loads(self.store.get(f"ended/{node}"))]
                    waiting.discard(node)
            if waiting:
                time.sleep(POLL_S)
        return fates, sorted(waiting)

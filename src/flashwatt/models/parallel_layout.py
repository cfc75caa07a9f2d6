"""The multi-GPU strategies of a model cell and how each lays out its ranks; torch-free, so
that the job's feasibility checks, the strategies and the context-parallel attention all
read them from here (flashwatt.models.parallel says what each strategy does)."""
from __future__ import annotations

STRATEGIES = ("fsdp", "ring", "zigzag", "ulysses", "hybrid")
CONTEXT_PARALLEL = ("ring", "zigzag", "ulysses", "hybrid")


def ulysses_size(strategy: str, world: int) -> int:
    """Ranks of one all-to-all: the world for ulysses, half of it for hybrid (a ring of 2)."""
    return {"ulysses": world, "hybrid": world // 2}.get(strategy, 1)

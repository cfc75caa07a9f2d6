"""Process groups per strategy: a 1-D group for ring/zigzag/ulysses, a 2-D mesh for hybrid.

`resolve` returns this rank's coordinates in the layout: its rank and the world size of
the strategy, the groups it talks over, and (hybrid) its ring and Ulysses indices.
"""
from __future__ import annotations

import os

import torch
import torch.distributed as dist

STRATEGIES = ("ring", "zigzag", "ulysses", "hybrid")
_DEFAULT_MESHES: dict = {}


def check_strategy(strategy: str) -> None:
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown strategy {strategy!r}; allowed: {', '.join(STRATEGIES)}")


def _is_mesh(group) -> bool:
    from torch.distributed.device_mesh import DeviceMesh

    return isinstance(group, DeviceMesh)


def default_mesh(ulysses_size: int | None = None):
    """The hybrid mesh (ring across nodes) x (Ulysses inside a node) over the whole world.

    The Ulysses size is the number of processes per node: LOCAL_WORLD_SIZE (torchrun),
    SLURM_NTASKS_PER_NODE, or the CUDA device count; it must divide the world size.
    Created once per size and process group (creation is collective: every rank calls it
    in the same order)."""
    from torch.distributed.device_mesh import init_device_mesh

    world = dist.get_world_size()
    if ulysses_size is None:
        env = os.environ.get("LOCAL_WORLD_SIZE") or os.environ.get("SLURM_NTASKS_PER_NODE", "").split("(")[0]
        ulysses_size = int(env) if env else (torch.cuda.device_count() or world)
    if ulysses_size < 1 or world % ulysses_size:
        raise ValueError(f"strategy 'hybrid': Ulysses size {ulysses_size} (processes per node) does not divide "
                         f"the world size {world}")
    # Keyed by the default group itself: a mesh of an earlier, destroyed process group
    # (a second job in the same process) must not be reused.
    key = (dist.group.WORLD, world, ulysses_size)
    if key not in _DEFAULT_MESHES:
        device = "cuda" if dist.get_backend() == "nccl" else "cpu"
        _DEFAULT_MESHES[key] = init_device_mesh(device, (world // ulysses_size, ulysses_size),
                                                mesh_dim_names=("ring", "ulysses"))
    return _DEFAULT_MESHES[key]


def forget_meshes() -> None:
    """Drop the meshes (and the rank-0 wait group) of this process's default group, once that
    group is destroyed."""
    from flashwatt.distributed import rank_zero

    _DEFAULT_MESHES.clear()
    rank_zero.forget()


def resolve(strategy: str, group=None) -> dict:
    check_strategy(strategy)
    if not dist.is_initialized():
        raise RuntimeError(f"strategy {strategy!r}: torch.distributed is not initialised "
                           "(call torch.distributed.init_process_group first)")
    if strategy != "hybrid":
        if _is_mesh(group):
            if group.ndim != 1:
                raise ValueError(f"strategy {strategy!r} takes a process group or a 1-D mesh, got a {group.ndim}-D mesh")
            group = group.get_group()
        pg = group if group is not None else dist.group.WORLD
        return {"strategy": strategy, "rank": dist.get_rank(pg), "world": dist.get_world_size(pg),
                "world_group": pg, "group": pg}
    mesh = default_mesh() if group is None else group
    if not _is_mesh(mesh) or mesh.ndim != 2:
        raise ValueError("strategy 'hybrid' takes a 2-D DeviceMesh (ring across nodes, Ulysses inside a node) "
                         "or group=None for the default one")
    if mesh.size() != dist.get_world_size():
        raise ValueError(f"strategy 'hybrid': the mesh covers {mesh.size()} ranks, the world has "
                         f"{dist.get_world_size()}; it must span the whole world")
    grid = mesh.mesh.tolist()
    positions = {g: (i, u) for i, row in enumerate(grid) for u, g in enumerate(row)}
    ring_size, ulysses_size = len(grid), len(grid[0])
    rank = dist.get_rank()
    ring_rank, ulysses_rank = positions[rank]
    return {"strategy": strategy, "rank": rank, "world": mesh.size(), "world_group": dist.group.WORLD,
            "ring_group": mesh.get_group(0), "ulysses_group": mesh.get_group(1), "positions": positions,
            "ring_size": ring_size, "ulysses_size": ulysses_size, "ring_rank": ring_rank,
            "ulysses_rank": ulysses_rank}

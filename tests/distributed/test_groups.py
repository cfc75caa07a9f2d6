"""The hybrid mesh cache of flashwatt.distributed.groups, in a one-process gloo group."""
from __future__ import annotations

import pytest
import torch.distributed as dist

from flashwatt.distributed.groups import default_mesh, forget_meshes
from support import free_ports


@pytest.fixture
def one_process_group():
    (port,) = free_ports()
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()
        forget_meshes()


def test_the_mesh_is_made_once_until_the_cache_is_cleared(one_process_group):
    mesh = default_mesh(1)
    assert mesh.ndim == 2 and mesh.size() == 1
    assert default_mesh(1) is mesh  # made once: creating a mesh is collective
    forget_meshes()
    assert default_mesh(1) is not mesh

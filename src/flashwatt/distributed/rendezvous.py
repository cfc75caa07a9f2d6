"""Rank, world size and rendezvous address of this process, and the process group start;
and, for the rank supervisor, this job's place among the nodes of a cell (`node_layout`).

A rank's place is taken, in order, from explicit arguments, torchrun's variables (RANK,
WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT: what the rank supervisor sets, as torchrun
does), submitit's local executor's (SUBMITIT_LOCAL_GLOBALID,
_NTASKS, _LOCALID; host 127.0.0.1) or Slurm's (a task per GPU: SLURM_PROCID,
SLURM_NTASKS, SLURM_LOCALID; the first host of SLURM_JOB_NODELIST). Without MASTER_PORT
the port is drawn from the job id the way submitit's TorchDistributedEnvironment draws
it (random.Random(job_id).randint(20000, 60000)), so every task agrees. submitit's
JobEnvironment reads these same variables; submitit is not imported here.
"""
from __future__ import annotations

import os
import random
import socket
import subprocess
from dataclasses import dataclass

import torch
import torch.distributed as dist

from flashwatt.distributed import rank_zero

# NVLink multicast (NVLS) can put a shared host's GPUs out of service: kept off in every
# process this package starts or initialises.
MULTICAST_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def multicast_off() -> None:
    os.environ.update(MULTICAST_OFF)


@dataclass(frozen=True)
class Rendezvous:
    rank: int
    world: int
    local_rank: int
    addr: str
    port: int
    nodes: int = 1


def free_port() -> int:
    """A port that is free now, and the one above it (the supervisors' store takes port + 1):
    a cell whose neighbour's port lands on its port + 1 fails to listen (EADDRINUSE)."""
    for _ in range(64):
        with socket.socket() as low:
            low.bind(("127.0.0.1", 0))
            port = low.getsockname()[1]
            if port >= 65535:
                continue
            with socket.socket() as high:
                try:
                    high.bind(("127.0.0.1", port + 1))
                except OSError:
                    continue
                return port
    raise OSError("no two free ports side by side on 127.0.0.1")


def _first_slurm_host() -> str:
    nodelist = os.environ.get("SLURM_JOB_NODELIST") or os.environ.get("SLURM_NODELIST")
    if not nodelist:
        return "127.0.0.1"
    out = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True, check=True)
    return out.stdout.split()[0]


def _port_of_job(job_id: str) -> int:
    return random.Random(job_id).randint(20000, 60000)


def from_environment(rank: int | None = None, world: int | None = None, local_rank: int | None = None,
                     addr: str | None = None, port: int | None = None) -> Rendezvous:
    env = os.environ
    if rank is None and "RANK" in env:
        rank, world = int(env["RANK"]), int(env["WORLD_SIZE"])
        local_rank = int(env.get("LOCAL_RANK", rank))
    elif rank is None and "SUBMITIT_LOCAL_GLOBALID" in env:
        rank, world = int(env["SUBMITIT_LOCAL_GLOBALID"]), int(env["SUBMITIT_LOCAL_NTASKS"])
        local_rank = int(env.get("SUBMITIT_LOCAL_LOCALID", rank))
        addr = addr or env.get("MASTER_ADDR", "127.0.0.1")
        port = port or int(env.get("MASTER_PORT") or _port_of_job(env.get("SUBMITIT_LOCAL_JOB_ID", "0")))
    elif rank is None and "SLURM_PROCID" in env:
        rank, world = int(env["SLURM_PROCID"]), int(env["SLURM_NTASKS"])
        local_rank = int(env.get("SLURM_LOCALID", 0))
        addr = addr or env.get("MASTER_ADDR") or _first_slurm_host()
        port = port or int(env.get("MASTER_PORT") or _port_of_job(env.get("SLURM_JOB_ID", "0")))
    elif rank is None:
        rank, world, local_rank = 0, 1, 0
    world = 1 if world is None else world
    local_rank = rank if local_rank is None else local_rank
    addr = addr or env.get("MASTER_ADDR", "127.0.0.1")
    if port is None:
        if "MASTER_PORT" in env:
            port = int(env["MASTER_PORT"])
        elif world == 1:
            port = free_port()
        else:
            raise ValueError(f"rank {rank} of {world}: no rendezvous port (set MASTER_PORT or pass port=)")
    nodes = int(env.get("NNODES") or env.get("SLURM_NNODES") or env.get("SUBMITIT_LOCAL_JOB_NUM_NODES") or 1)
    return Rendezvous(rank, world, local_rank, addr, int(port), nodes)


def start(rdv: Rendezvous) -> torch.device:
    """Initialise the default process group (NCCL on CUDA, gloo otherwise); returns the device.

    Its timeout, the rendezvous's included, is the failure policy's timeout for the backend
    (flashwatt.submit.failure_policy, read from the environment the rank supervisor
    sets): a rank waiting that long on a peer raises, or the NCCL watchdog ends it.
    Also opens the group the other ranks wait on while rank 0 works alone
    (flashwatt.distributed.rank_zero), and sets LOCAL_WORLD_SIZE (processes per node, the
    hybrid strategy's Ulysses size) where the launcher did not."""
    from flashwatt.submit.failure_policy import FailurePolicy

    multicast_off()
    os.environ.setdefault("LOCAL_WORLD_SIZE", str(max(1, rdv.world // rdv.nodes)))
    policy = FailurePolicy.from_environment()
    if torch.cuda.is_available():
        device = torch.device("cuda", rdv.local_rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", init_method=f"tcp://{rdv.addr}:{rdv.port}", rank=rdv.rank,
                                world_size=rdv.world, device_id=device, timeout=policy.timeout_for("nccl"))
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo", init_method=f"tcp://{rdv.addr}:{rdv.port}", rank=rdv.rank,
                                world_size=rdv.world, timeout=policy.timeout_for("gloo"))
    rank_zero.open_group()  # where the others wait on rank 0's phases alone (flashwatt.distributed.rank_zero)
    return device


@dataclass(frozen=True)
class NodeLayout:
    """A cell of `nodes` x `per_node` ranks, seen from one node's job task: which node this
    is, and where rank 0 listens (`port`; the supervisors' own store takes `port + 1`)."""
    nodes: int
    node: int
    per_node: int
    addr: str
    port: int
    host: str

    @property
    def world(self) -> int:
        return self.nodes * self.per_node

    def rank_of(self, local_rank: int) -> int:
        return self.node * self.per_node + local_rank


def node_layout(processes: int, nodes: int = 1) -> NodeLayout:
    """This job task's node in a cell of `processes` ranks over `nodes` nodes, one task per
    node: Slurm's SLURM_NODEID and SLURM_NNODES, or submitit's local executor (one node).
    Rank 0 is on the first host of SLURM_JOB_NODELIST (scontrol show hostnames), or
    MASTER_ADDR where set; the port is MASTER_PORT, else drawn from the job id (every node
    draws the same), else, on one node, a free one."""
    env = os.environ
    if nodes < 1 or processes % nodes:
        raise ValueError(f"a cell of {processes} processes cannot be split evenly over {nodes} nodes")
    if "SLURM_NODEID" in env and "SUBMITIT_LOCAL_JOB_ID" not in env:
        have, node = int(env.get("SLURM_NNODES", "1")), int(env["SLURM_NODEID"])
        job_id = env.get("SLURM_JOB_ID", "0")
    else:
        have, node, job_id = 1, 0, env.get("SUBMITIT_LOCAL_JOB_ID", "0")
    if have != nodes:
        raise ValueError(f"the cell asks for {nodes} node(s) but its job runs on {have} (resource nodes, or the "
                         "Slurm allocation)")
    addr = env.get("MASTER_ADDR") or (_first_slurm_host() if nodes > 1 else "127.0.0.1")
    if env.get("MASTER_PORT"):
        port = int(env["MASTER_PORT"])
    else:
        port = _port_of_job(job_id) if nodes > 1 else free_port()
    return NodeLayout(nodes, node, processes // nodes, addr, port, socket.gethostname())

"""Exposed communication can never exceed the step it belongs to (flashwatt.models.comm_timeline).

Property-style: thousands of constructed timelines (random collectives and compute spans,
some sticking out of the step, overlapping, nested, empty) through the split the record
is made from, and the same rule on real profiler events of a gloo step.
"""
from __future__ import annotations

import random
from types import SimpleNamespace

import pytest

from flashwatt.models.comm_timeline import EXPOSED_METHOD, exposure, length, merge, split

TIMELINES = 3000


def _spans(rng: random.Random, window: tuple[float, float], count: int) -> list[tuple[float, float]]:
    lo, hi = window
    width = hi - lo
    out = []
    for _ in range(count):
        # Spans may start before the step and end after it (a collective launched early,
        # a kernel still running at the edge of the profile): the split must cut them.
        start = rng.uniform(lo - 0.5 * width, hi + 0.2 * width)
        out.append((start, start + rng.expovariate(1.0 / (0.3 * width))))
    return out


def _timeline(seed: int):
    rng = random.Random(seed)
    start = rng.uniform(-1e6, 1e6)
    window = (start, start + rng.choice([rng.uniform(1e-3, 1.0), rng.uniform(1.0, 1e5)]))
    return (window, _spans(rng, window, rng.randint(0, 40)), _spans(rng, window, rng.randint(0, 40)))


@pytest.mark.parametrize("chunk", range(3))
def test_exposed_communication_never_exceeds_its_step_over_constructed_timelines(chunk):
    for seed in range(chunk * TIMELINES, (chunk + 1) * TIMELINES):
        window, comm, compute = _timeline(seed)
        got = exposure(comm, compute, window)
        step = window[1] - window[0]
        slack = 1e-9 * max(1.0, abs(window[0]), abs(window[1]))
        assert got["step"] == pytest.approx(step)
        assert 0.0 <= got["exposed"] <= got["communication"] + slack, (seed, got)
        assert got["communication"] <= step + slack, (seed, got)
        assert got["exposed"] <= step + slack, (seed, got)
        assert got["hidden"] >= 0.0 and got["hidden"] + got["exposed"] == pytest.approx(got["communication"])


def test_a_collective_that_outlasts_the_step_is_cut_to_the_step():
    # A 270 ms collective in a 186 ms step, nothing else running: all of the step is
    # exposed communication, never more (the record that once said 1.45 of the step).
    got = exposure([(-50.0, 220.0)], [], (0.0, 186.0))
    assert got == {"step": 186.0, "communication": 186.0, "exposed": 186.0, "hidden": 0.0}
    # compute under half of it: that half is hidden
    got = exposure([(-50.0, 220.0)], [(0.0, 93.0)], (0.0, 186.0))
    assert got["exposed"] == pytest.approx(93.0) and got["hidden"] == pytest.approx(93.0)


def test_overlapping_collectives_count_once():
    got = exposure([(0.0, 4.0), (3.0, 6.0), (10.0, 12.0)], [(1.0, 2.0), (5.0, 11.0)], (0.0, 12.0))
    assert got["communication"] == length(merge([(0.0, 6.0), (10.0, 12.0)])) == 8.0
    assert got["hidden"] == 3.0 and got["exposed"] == 5.0


def _event(name, start, end, cuda, children=(), annotation=False):
    from torch.autograd import DeviceType

    return SimpleNamespace(name=name, time_range=SimpleNamespace(start=start, end=end),
                           device_type=DeviceType.CUDA if cuda else DeviceType.CPU, cpu_children=list(children),
                           is_async=False, is_user_annotation=annotation)


def test_the_split_of_gpu_events_windows_the_step_on_the_device_and_ignores_host_ranges():
    events = [_event("ncclDevKernel_AllGather_RING_LL", 0.0, 50.0, True),
              _event("ampere_bf16_gemm", 40.0, 100.0, True),
              _event("FSDP::all_gather", -500.0, 900.0, True, annotation=True),  # a user's range: not compute
              _event("aten::mm", -1000.0, 2000.0, False)]                         # host side: not on the device
    comm, compute, kinds, window = split(events, on_gpu=True)
    assert window == (0.0, 100.0) and comm == [(0.0, 50.0)] and compute == [(40.0, 100.0)]
    assert kinds == {"allgather": 50.0}
    assert exposure(comm, compute, window)["exposed"] == 40.0


def test_the_split_of_cpu_events_counts_gloo_work_and_innermost_operators_only():
    gloo = _event("gloo:all_reduce", 10.0, 30.0, False, annotation=True)
    gloo.is_async = True
    events = [_event("aten::matmul", 0.0, 12.0, False, children=["aten::mm"]), _event("aten::mm", 1.0, 12.0, False),
              gloo, _event("my_range", -100.0, 100.0, False, annotation=True)]
    comm, compute, kinds, window = split(events, on_gpu=False)
    assert comm == [(10.0, 30.0)] and compute == [(1.0, 12.0)] and window == (0.0, 30.0)
    assert exposure(comm, compute, window) == {"step": 30.0, "communication": 20.0, "exposed": 18.0, "hidden": 2.0}


@pytest.mark.slow  # a gloo process group, each rank importing torch
def test_a_gloo_step_profiled_for_real_splits_within_its_window(tmp_path):
    """Two gloo processes, one all-reduce and some compute per step: the split the record
    is made from keeps exposed <= communication <= the step on real profiler events."""
    import json

    import torch.multiprocessing as mp

    from support import free_ports

    out = tmp_path / "split.json"
    mp.spawn(_gloo_rank, args=(free_ports(1)[0], str(out)), nprocs=2, join=True)
    result = json.loads(out.read_text())
    assert result["exposed_method"] == EXPOSED_METHOD and result["steps"] == 3
    assert result["communication_ms"] > 0 and result["step_ms"] > 0
    assert 0 <= result["exposed_ms"] <= result["communication_ms"] <= result["step_ms"]
    assert 0 <= result["exposed_share_of_step"] <= 1
    assert "allreduce" in result["by_kind_ms"]


def _gloo_rank(rank: int, port: int, out: str) -> None:
    import datetime
    import json

    import torch
    import torch.distributed as dist

    from flashwatt.models.comm_timeline import communication_split

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2,
                            timeout=datetime.timedelta(seconds=60))
    x = torch.randn(256, 256)

    def run():
        y = x @ x
        dist.all_reduce(y)
        (y @ x).sum()

    result = communication_split(run, torch.device("cpu"), 3, before=dist.barrier)
    dist.destroy_process_group()
    if rank == 0:
        with open(out, "w") as fh:
            json.dump(result, fh)

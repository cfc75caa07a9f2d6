"""`Controller.step` with a real model attached, on the CPU, in real time: a tiny Llama's
training steps under the controller, reading a fake NVML (tests/fake_nvml.py) whose board
draws its busy watts while the steps compute and its idle watts while the pacer sleeps.

What this proves beside the simulated runs of tests/test_control_step.py: the attached
model's knobs (backends through the registry, each one the CPU cannot run refused with its
reason and its failed step redone without a trace; recompute on a share of the blocks;
pacing points at the blocks' hooks), the sensor's thread, and that no NVML setter is ever
asked for. The controller changes how a step runs, never what it computes: the losses are
those of the same steps without it."""
from __future__ import annotations

import time

import pytest
import torch
import torch.nn.functional as F

from fake_nvml import FakeGpu, FakeNvml, uuid_for
from flashwatt.control.configuration import ControlError
from flashwatt.control.controller import Controller
from flashwatt.models.presets import model_spec
from flashwatt.models.recompute import recomputed_blocks
from flashwatt.models.step import build_model
from flashwatt.models.step_knobs import ModelKnobs
from flashwatt.telemetry import open_telemetry

IDLE_W, BUSY_W = 100.0, 500.0


@pytest.fixture(autouse=True)
def one_thread():
    """One CPU thread: on a shared machine several threads per op make a 0.1 s step take seconds."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def tiny_llama():
    return build_model(model_spec("llama_tiny"), "fp32", torch.device("cpu"), seed=0)


def batches(model, count: int):
    generator = torch.Generator().manual_seed(1)
    vocab = model.config.vocab_size
    return [torch.randint(0, vocab, (2, 32), generator=generator) for _ in range(count)]


def train_step(model, optimizer, tokens):
    def step(plan):
        parts = tokens.chunk(plan.micro_batches if plan is not None else 1)
        total = 0.0
        for part in parts:
            logits = model(input_ids=part, use_cache=False).logits
            loss = F.cross_entropy(logits[:, :-1].flatten(0, 1), part[:, 1:].flatten()) / len(parts)
            loss.backward()
            total += loss.item()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return total
    return step


def board():
    gpu = FakeGpu(uuid_for(0), power_w=IDLE_W, update_period_s=0.02)
    nvml = FakeNvml([gpu])
    return gpu, nvml, open_telemetry(None, nvml=nvml)


def test_a_tiny_llama_trains_under_the_controller_and_no_device_setting_is_touched():
    reference = tiny_llama()
    optimizer = torch.optim.AdamW(reference.parameters(), lr=1e-3)
    data = batches(reference, 8)
    expected = [train_step(reference, optimizer, tokens)(None) for tokens in data]

    model = tiny_llama()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    gpu, nvml, telemetry = board()

    def sleep(seconds):  # the pacer's idle time is the board's idle
        gpu.set_power(IDLE_W)
        time.sleep(seconds)
        gpu.set_power(BUSY_W)

    ctl = Controller("budget", 400.0, "cpu", telemetry=telemetry, idle_w=IDLE_W, cache=None, sleep=sleep,
                     knobs={"micro_batches": [1, 2], "recompute": [0, 50]})
    losses = []
    with ctl:
        ctl.attach(model)
        gpu.set_power(BUSY_W)
        for tokens in data:
            losses.append(ctl.step(train_step(model, optimizer, tokens), tokens=tokens.numel()))
        gpu.set_power(IDLE_W)
        time.sleep(0.3)  # a few ticks more
    assert nvml.setter_calls == [] and not any(name.startswith("nvmlDeviceSet") for name in gpu.calls)
    assert losses == pytest.approx(expected, rel=1e-5)
    refused = ctl.refusals()
    for backend in ("custom", "sdpa_cudnn", "sdpa_flash"):
        assert any(key.endswith(f"{backend}") and "needs a CUDA device" in why for key, why in refused.items()), refused
    ran = ctl.call_counts()
    assert sum(ran.values()) == len(data) and all(label.startswith("sdpa_default") for label in ran)
    trace = ctl.trace()
    assert len(trace) >= 3 and trace["power_w"].notna().all()
    assert ctl._pacer.points >= 2 * len(model.model.layers)  # the blocks' hooks paced


def test_recompute_on_a_share_of_the_blocks_sets_their_flags_evenly():
    assert recomputed_blocks(16, 50) == [1, 3, 5, 7, 9, 11, 13, 15]
    assert recomputed_blocks(16, 100) == list(range(16)) and recomputed_blocks(16, 0) == []
    model = tiny_llama()
    model.train()
    knobs = ModelKnobs(model)
    from flashwatt.control.configuration import Configuration

    knobs.apply(Configuration("sdpa_default", recompute=100))
    assert all(block.gradient_checkpointing for block in knobs.blocks)
    knobs.apply(Configuration("sdpa_default", recompute=0))
    assert not any(block.gradient_checkpointing for block in knobs.blocks)
    model.eval()
    assert ModelKnobs(model).refusal(Configuration("sdpa_default", recompute=50)).endswith(
        "activation recompute applies to training steps (the model is in eval mode)")


def test_a_cheaper_precision_is_taken_only_where_the_probe_agrees_within_the_tolerance():
    model = tiny_llama()
    gpu, nvml, telemetry = board()
    for tolerance, taken in ((0.5, True), (1e-9, False)):
        ctl = Controller("energy", None, "cpu", telemetry=telemetry, idle_w=IDLE_W, cache=None,
                         knobs={"backend": ["sdpa_default"], "precision": ["bf16"]}, precision_tolerance=tolerance)
        with ctl:
            ctl.attach(model)
            for _ in range(8):
                ctl.step(lambda: model(input_ids=torch.zeros(1, 16, dtype=torch.long)).logits.sum().item())
        checks = ctl.checks()
        assert len(checks) >= 1 and (checks["against"] == "the model's own precision (the step's probe)").all()
        assert bool(checks["passed"].iloc[0]) == taken
        refused = [why for key, why in ctl.refusals().items() if key.endswith("bf16")]
        assert bool(refused) != taken and all("precision check failed" in why for why in refused)
    with pytest.raises(ControlError, match="knob precision needs precision_tolerance"):
        Controller("static", configuration="sdpa_default", device="cpu", knobs={"precision": ["bf16"]})


def test_pacing_points_in_a_compiled_module_are_traced_away_without_a_graph_break():
    """torch.compile traces the blocks' hooks with the rest (fullgraph: a graph break would
    raise): a pacing point sees the trace and does nothing there, and the compiled step is
    paced between steps only."""
    net = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64))
    gpu, nvml, telemetry = board()
    ctl = Controller("static", configuration="unchanged", duty=0.5, device="cpu", telemetry=telemetry, idle_w=IDLE_W,
                     cache=None)
    with ctl:
        for block in net:
            block.register_forward_pre_hook(lambda module, args: ctl.pace())
        compiled = torch.compile(net, backend="eager", fullgraph=True)
        x = torch.randn(8, 64)
        for _ in range(4):
            ctl.step(lambda: compiled(x).sum().item())
        assert ctl._pacer.points == 4  # between the steps only: none traced into the graph
        assert ctl.slept_s > 0

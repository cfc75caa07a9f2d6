"""flashwatt.training's optimizers and learning-rate schedules, on the CPU."""
from __future__ import annotations

import math

import pytest
import torch
from lion_pytorch import Lion

from flashwatt.training.optimizers import OPTIMIZERS, make_optimizer, parameter_groups
from flashwatt.training.schedules import SCHEDULES, lr_multiplier, make_schedule


def small_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Embedding(50, 8), torch.nn.LayerNorm(8), torch.nn.Linear(8, 8))


# --- optimizers -----------------------------------------------------------------------


def test_weight_decay_groups_hold_matrices_only():
    model = small_model()
    model[2].bias.requires_grad_(False)  # frozen: in no group
    decayed, kept = parameter_groups(model.parameters(), weight_decay=0.1)
    assert [p.shape for p in decayed["params"]] == [(50, 8), (8, 8)]  # embedding and linear weights
    assert decayed["weight_decay"] == 0.1
    assert [p.shape for p in kept["params"]] == [(8,), (8,)]  # the norm's gain and bias
    assert kept["weight_decay"] == 0.0
    assert len(parameter_groups([torch.nn.Parameter(torch.ones(3))], 0.1)) == 1  # no empty group


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_a_step_decays_the_matrices_and_leaves_biases_and_norms(name):
    # With zero gradients both optimizers move a parameter only by weight decay:
    # p <- p * (1 - lr * wd) for matrices, unchanged for the rest.
    model = small_model()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    optimizer = make_optimizer(name, model.parameters(), lr=0.1, weight_decay=0.5)
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    optimizer.step()
    for n, p in model.named_parameters():
        factor = 1 - 0.1 * 0.5 if p.ndim >= 2 else 1.0
        torch.testing.assert_close(p.detach(), before[n] * factor, msg=f"{name}: {n}")


def test_adamw_takes_the_foreach_path_off_the_gpu_with_language_model_betas():
    optimizer = make_optimizer("adamw", small_model().parameters(), lr=1e-3, weight_decay=0.1)
    assert type(optimizer) is torch.optim.AdamW
    assert optimizer.defaults["foreach"] is True and not optimizer.defaults["fused"]
    assert optimizer.defaults["betas"] == (0.9, 0.95) and optimizer.defaults["lr"] == 1e-3


def test_lion_comes_from_its_package_with_its_authors_betas():
    optimizer = make_optimizer("lion", small_model().parameters(), lr=1e-4, weight_decay=1.0)
    assert isinstance(optimizer, Lion) and optimizer.defaults["betas"] == (0.9, 0.99)
    given = make_optimizer("lion", small_model().parameters(), lr=1e-4, weight_decay=1.0, betas=(0.95, 0.98))
    assert all(g["betas"] == (0.95, 0.98) for g in given.param_groups)


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_each_optimizer_fits_a_small_regression(name):
    torch.manual_seed(0)
    x = torch.randn(256, 8)
    y = x @ torch.randn(8, 1)
    model = torch.nn.Linear(8, 1)
    optimizer = make_optimizer(name, model.parameters(), lr=0.05 if name == "adamw" else 0.01, weight_decay=0.0)
    first = None
    for _ in range(200):
        loss = torch.nn.functional.mse_loss(model(x), y)
        first = first if first is not None else loss.item()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    assert loss.item() < first / 20


@pytest.mark.parametrize("arguments, message", [
    ({"name": "sgd"}, "unknown optimizer 'sgd'; allowed: adamw, lion"),
    ({"lr": 0.0}, "learning rate 0.0 must be positive"),
    ({"weight_decay": -0.1}, "weight decay -0.1 must be zero or positive"),
    ({"betas": (0.9, 1.0)}, r"betas \(0.9, 1.0\) must be two numbers in \[0, 1\)"),
])
def test_bad_optimizer_settings_are_refused(arguments, message):
    settings = {"name": "adamw", "lr": 1e-3, "weight_decay": 0.1} | arguments
    with pytest.raises(ValueError, match=message):
        make_optimizer(params=small_model().parameters(), **settings)


# --- schedules ------------------------------------------------------------------------

TOTAL, WARMUP, FLOOR = 1000, 100, 0.1


def multiplier(name, step, **options):
    return lr_multiplier(name, step, total_steps=TOTAL, warmup_steps=WARMUP, **options)


@pytest.mark.parametrize("name", sorted(SCHEDULES))
def test_every_schedule_warms_up_linearly_to_the_peak(name):
    assert multiplier(name, 0) == pytest.approx(1 / WARMUP)  # the first step learns already
    assert multiplier(name, WARMUP // 2 - 1) == pytest.approx(0.5)
    assert multiplier(name, WARMUP - 1) == pytest.approx(1.0)  # the peak at the end of warm-up
    assert multiplier(name, WARMUP) == pytest.approx(1.0)


def test_cosine_falls_from_the_peak_to_the_floor():
    last = TOTAL - 1

    def expected(step):
        progress = (step - WARMUP) / (last - WARMUP)
        return FLOOR + (1 - FLOOR) * 0.5 * (1 + math.cos(math.pi * progress))

    for step in (WARMUP, WARMUP + 1, 300, 550, 900, last - 1):
        assert multiplier("cosine", step) == pytest.approx(expected(step))
    assert multiplier("cosine", (WARMUP + last) / 2) == pytest.approx((1 + FLOOR) / 2)  # half-way: mid-height
    assert multiplier("cosine", last) == pytest.approx(FLOOR)
    assert multiplier("cosine", last + 50) == pytest.approx(FLOOR)  # past the end: the floor
    assert multiplier("cosine", last, floor=0.0) == pytest.approx(0.0)
    values = [multiplier("cosine", s) for s in range(WARMUP, TOTAL)]
    assert all(a >= b for a, b in zip(values, values[1:]))


def test_wsd_holds_the_peak_then_decays_linearly_over_the_last_fifth():
    start, last = TOTAL - 200, TOTAL - 1  # decay_fraction 0.2: the last 200 steps
    for step in (WARMUP, 500, start - 1, start):
        assert multiplier("wsd", step) == pytest.approx(1.0)
    for step in (start + 1, 850, 900, last - 1):
        assert multiplier("wsd", step) == pytest.approx(1 - (1 - FLOOR) * (step - start) / (last - start))
    assert multiplier("wsd", last) == pytest.approx(FLOOR)
    assert multiplier("wsd", last + 10) == pytest.approx(FLOOR)
    assert multiplier("wsd", 949, decay_fraction=0.05) == pytest.approx(1.0)  # the last 50 steps only
    assert multiplier("wsd", 975, decay_fraction=0.05) < 1.0


def test_constant_stays_at_the_peak():
    assert {multiplier("constant", s) for s in (WARMUP, 500, TOTAL - 1, TOTAL + 10)} == {1.0}


def test_no_warmup_starts_at_the_peak():
    assert lr_multiplier("cosine", 0, total_steps=10, warmup_steps=0) == 1.0
    assert lr_multiplier("cosine", 9, total_steps=10, warmup_steps=0) == pytest.approx(FLOOR)


def test_the_scheduler_sets_each_groups_learning_rate_and_resumes_from_its_state():
    model = small_model()
    optimizer = make_optimizer("adamw", model.parameters(), lr=3e-3, weight_decay=0.1)
    scheduler = make_schedule("cosine", optimizer, total_steps=TOTAL, warmup_steps=WARMUP)
    seen = []
    for step in range(300):
        seen.append([g["lr"] for g in optimizer.param_groups])
        optimizer.step()
        scheduler.step()
    for step in (0, WARMUP - 1, 250, 299):
        assert seen[step] == pytest.approx([3e-3 * multiplier("cosine", step)] * 2)
    # A run resumed at step 300 continues on the same curve: optimizer and schedule made
    # first, then both states loaded (making the schedule resets the groups' lr to step 0's).
    resumed_optimizer = make_optimizer("adamw", small_model().parameters(), lr=3e-3, weight_decay=0.1)
    resumed = make_schedule("cosine", resumed_optimizer, total_steps=TOTAL, warmup_steps=WARMUP)
    resumed_optimizer.load_state_dict(optimizer.state_dict())
    resumed.load_state_dict(scheduler.state_dict())
    assert resumed.get_last_lr() == pytest.approx([3e-3 * multiplier("cosine", 300)] * 2)
    assert resumed_optimizer.param_groups[0]["lr"] == pytest.approx(3e-3 * multiplier("cosine", 300))


@pytest.mark.parametrize("name, options, message", [
    ("linear", {}, "unknown schedule 'linear'; allowed: cosine, wsd, constant"),
    ("cosine", {"warmup_steps": TOTAL}, "warmup_steps 1000 must be at least 0 and less than total_steps 1000"),
    ("cosine", {"total_steps": 0, "warmup_steps": 0}, "total_steps 0 must be at least 1"),
    ("cosine", {"floor": 1.5}, r"floor 1.5 must lie in \[0, 1\]"),
    ("wsd", {"decay_fraction": 0.0}, r"decay_fraction 0.0 must lie in \(0, 1\]"),
    ("wsd", {"warmup_steps": 900}, "warm-up .900 steps. and decay .the last 200 of 1000 steps. overlap"),
])
def test_bad_schedules_are_refused(name, options, message):
    settings = {"total_steps": TOTAL, "warmup_steps": WARMUP} | options
    optimizer = make_optimizer("adamw", small_model().parameters(), lr=1e-3, weight_decay=0.1)
    with pytest.raises(ValueError, match=message):
        make_schedule(name, optimizer, **settings)

"""Model-level cells on a real GPU: every backend plugged into a Llama and a GPT-2 shape
passes the model check (logits, causality, one block's gradients against float32), our
kernel runs grouped-query attention natively, and a whole cell measures energy per token."""
from __future__ import annotations

import pytest
import torch

from flashwatt.models.attention import BACKENDS, use_backend
from flashwatt.models.cell import ModelCell
from flashwatt.models.check import check_model
from flashwatt.models.job import run_model_cell
from flashwatt.models.presets import model_spec
from flashwatt.models.step import build_model, reference_factory

pytestmark = pytest.mark.gpu
DEVICE = torch.device("cuda")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("model", ["llama_tiny", "gpt2_tiny"])
@pytest.mark.parametrize("train", [False, True])
def test_every_backend_computes_the_model(backend, model, train):
    net = build_model(model_spec(model), "bf16", DEVICE, seed=0)
    use_backend(net, backend, "bf16", train)
    result = check_model(net, reference_factory(net, DEVICE), "bf16", net.config.vocab_size, train, seed=0)
    assert result["causal"]["passed"], result["causal"]
    assert result["logits"]["passed"], result["logits"]
    assert result["logits"]["error"] < 5e-2
    if train:
        assert result["grad"]["passed"], result["grad"]


def test_custom_runs_llama_grouped_query_attention_without_expanding():
    """Llama-3.2-1B's shape (32 query heads over 8 K/V heads, head dim 64) at 1024 tokens."""
    net = build_model(model_spec("llama_3_2_1b"), "bf16", DEVICE, seed=0)
    adapter = use_backend(net, "custom", "bf16", train=True)
    result = check_model(net, reference_factory(net, DEVICE), "bf16", net.config.vocab_size, True, seed=0)
    assert result["passed"], result
    assert adapter.kv_expanded is False


def tiny_spec(energy_window_s: float = 0.5, **steps) -> dict:
    """The tiny Llama's job spec with short steps and energy windows; `steps` overrides."""
    return {"model": model_spec("llama_tiny"), "seed": 0,
            "steps": {"warmup_steps": 2, "timed_steps": 5, "attention_steps": 2, **steps},
            "measure": {"energy_window_s": energy_window_s, "idle_settle_s": 0.2, "idle_window_s": 0.3}}


def test_a_model_cell_measures_its_step_and_energy_per_token():
    cell = ModelCell("gputest", "llama_tiny", "custom", "bf16", "train", 512, 4)
    record = run_model_cell(cell, tiny_spec(energy_window_s=1.0, timed_steps=3)).record
    assert record["status"] == "ok", record.get("reason") or record.get("traceback")
    timing = record["timing"]
    assert timing["forward_ms"] > 0 and timing["backward_ms"] > 0 and timing["optimizer_ms"] > 0
    assert 0 < record["attention"]["share"] < 1
    assert record["attention"]["calls_per_step"] == 2  # one per layer
    assert record["energy"]["j_per_token"] > 0
    assert record["memory"]["peak_allocated_bytes"] > 0


def test_a_decode_cell_measures_tokens_per_second_and_energy_over_a_fixed_context():
    cell = ModelCell("gputest", "llama_tiny", "sdpa_default", "bf16", "decode", 1024, 8)
    record = run_model_cell(cell, tiny_spec()).record
    assert record["status"] == "ok", record.get("reason") or record.get("traceback")
    assert record["check"]["decode"]["passed"], record["check"]
    assert record["attention"]["calls_per_step"] == 2  # one per layer, over the cache
    assert record["timing"]["tokens_per_s"] == pytest.approx(8 / (record["timing"]["step_ms"] / 1e3))
    assert record["energy"]["j_per_token"] > 0


def test_paired_rounds_time_a_backend_beside_the_default_with_the_energy_of_each():
    """Eager attention on a tiny Llama at 1024 tokens is attention-bound, so beside the
    SDPA default it must come out slower, in time and in joules per token, every round."""
    cell = ModelCell("gputest", "llama_tiny", "eager", "bf16", "prefill", 1024, 8)
    record = run_model_cell(cell, tiny_spec(attention_steps=0, paired_rounds=2)).record
    assert record["status"] == "ok", record.get("reason") or record.get("traceback")
    paired = record["paired"]
    assert len(paired["rounds"]) == 2 and "reason" not in paired, paired
    for r in paired["rounds"]:
        assert r["implementation"] == {"eager": "eager", "sdpa_default": "sdpa"}
        assert r["step_ms"]["eager"] > r["step_ms"]["sdpa_default"] > 0, r
        assert r["j_per_token"]["eager"] > r["j_per_token"]["sdpa_default"] > 0, r
    assert paired["speed"] < 1 < paired["energy"]


def controller_cell(backend: str) -> dict:
    cell = ModelCell("gputest", "llama_3_2_1b", backend, "bf16", "prefill", 4096, 1)
    spec = {"model": model_spec("llama_3_2_1b"), "seed": 0,
            "steps": {"warmup_steps": 2, "timed_steps": 5, "attention_steps": 2, "control_settle_s": 40.0},
            "measure": {"energy_window_s": 3.0, "idle_settle_s": 0.5, "idle_window_s": 0.5}}
    return run_model_cell(cell, spec).record


def test_the_energy_controller_as_a_model_backend_settles_measures_and_checks_what_it_ran():
    record = controller_cell("control_energy")
    assert record["status"] == "ok", record.get("reason") or record.get("traceback")
    control = record["control"]
    assert control["settle"]["settled"], control["settle"]
    assert control["measured_calls"], control
    # every configuration that ran while measured was checked against float32, pinned
    assert set(control["measured_calls"]) == set(record["check"]["configurations"])
    assert all(r["passed"] for r in record["check"]["configurations"].values())
    learned = {row["config"] for row in control["learned"] if row["j_per_token"]}
    assert len(learned) >= 2, control["learned"]  # it compared configurations before choosing
    assert record["energy"]["j_per_token"] > 0 and 0 < record["attention"]["share"] < 1
    print({k: control[k] for k in ("settle", "measured_calls", "choices", "refusals")},
          record["timing"]["tokens_per_s"], record["energy"]["j_per_token"], record["energy"]["avg_power_w"])


def test_the_budget_controller_holds_a_whole_models_power_under_its_budget():
    open_loop = controller_cell("control_energy")["energy"]["avg_power_w"]
    budget = round(0.75 * open_loop)
    record = controller_cell(f"control_{budget}w")
    assert record["status"] == "ok", record.get("reason") or record.get("traceback")
    power = record["energy"]["avg_power_w"]
    assert power <= budget * 1.03, (power, budget, open_loop)
    assert power >= budget * 0.85, (power, budget)  # held near the budget, not far under it
    print({"open_loop_w": open_loop, "budget_w": budget, "held_w": power,
           "tokens_per_s": record["timing"]["tokens_per_s"], "choices": record["control"]["choices"]})

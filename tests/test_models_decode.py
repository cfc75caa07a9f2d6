"""Decode cells on the CPU: one new token per sequence over a KV cache of the context,
the context held fixed step after step, the check that catches a dropped cache, the FLOP
count, and which backends decode."""
from __future__ import annotations

import pytest
import torch

from flashwatt.config import validate_config
from flashwatt.models.attention import use_backend
from flashwatt.models.cell import ModelCell
from flashwatt.models.check import check_model
from flashwatt.models.flops import step_flops
from flashwatt.models.job import run_model_cell
from flashwatt.models.presets import model_spec, shape_of
from flashwatt.models.step import build_model, fill_cache, make_step, reference_factory
from flashwatt.models.suite import model_runs
from support import model_cell_spec

CPU = torch.device("cpu")


@pytest.mark.parametrize("model", ["llama_tiny", "gpt2_tiny"])
@pytest.mark.parametrize("backend", ["eager", "sdpa_default"])
def test_a_decode_cell_makes_one_token_per_sequence_and_checks_it_against_a_full_forward(model, backend):
    cell = ModelCell("t", model, backend, "fp32", "decode", 48, 3)
    record = run_model_cell(cell, model_cell_spec(model, timed_steps=3)).record
    assert record["status"] == "ok", record.get("reason") or record.get("traceback")
    assert cell.tokens == 3 and cell.name == "decode-L48-B3"
    assert record["timing"]["tokens_per_s"] == pytest.approx(3 / (record["timing"]["step_ms"] / 1e3))
    decode = record["check"]["decode"]
    assert decode["passed"] and decode["error"] <= decode["tolerance"]


def test_every_decode_step_sees_the_same_context():
    model = build_model(model_spec("llama_tiny"), "fp32", CPU, 0)
    cell = ModelCell("t", "llama_tiny", "sdpa_default", "fp32", "decode", 40, 2)
    use_backend(model, "sdpa_default", "fp32", False)
    step = make_step(model, cell, CPU, 0)
    assert step.cache.get_seq_length() == 40
    for _ in range(4):
        step.run()
        assert step.cache.get_seq_length() == 40


def test_an_eager_cells_cache_is_filled_under_sdpa_and_its_steps_run_eager(monkeypatch):
    """The context's prefill runs under SDPA (no L x L scores), the decode steps under the
    cell's own backend, and the cache holds the keys and values an eager prefill makes."""
    model = build_model(model_spec("llama_tiny"), "fp32", CPU, 0)
    tokens = torch.randint(0, model.config.vocab_size, (2, 24))
    use_backend(model, "eager", "fp32", False)
    with torch.no_grad():
        eager_cache = model(input_ids=tokens, use_cache=True).past_key_values
    seen = []
    module = __import__(type(model.model.layers[0].self_attn).__module__, fromlist=["eager_attention_forward"])
    eager = module.eager_attention_forward
    monkeypatch.setattr(module, "eager_attention_forward", lambda *a, **k: seen.append(a[1].shape[2]) or eager(*a, **k))
    cache = fill_cache(model, tokens)
    assert seen == [] and model.config._attn_implementation == "eager"
    for layer, reference in zip(cache.layers, eager_cache.layers):
        torch.testing.assert_close(layer.keys, reference.keys, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(layer.values, reference.values, rtol=1e-5, atol=1e-5)
    with torch.no_grad():
        model(input_ids=tokens[:, :1], past_key_values=cache, use_cache=True)
    assert seen and set(seen) == {1}  # one query per sequence, through the eager function


def test_the_decode_check_fails_an_attention_that_drops_the_cache(monkeypatch):
    from transformers.cache_utils import DynamicLayer

    model = build_model(model_spec("llama_tiny"), "fp32", CPU, 0)
    use_backend(model, "sdpa_default", "fp32", False)
    honest = check_model(model, reference_factory(model, CPU), "fp32", model.config.vocab_size, False, 0, decode=True)
    assert honest["decode"]["passed"] and honest["passed"]

    update = DynamicLayer.update

    def forgetful(self, key_states, value_states, *args, **kwargs):
        update(self, key_states, value_states, *args, **kwargs)
        return key_states, value_states  # attend to the new token only

    monkeypatch.setattr(DynamicLayer, "update", forgetful)
    broken = check_model(model, reference_factory(model, CPU), "fp32", model.config.vocab_size, False, 0, decode=True)
    assert not broken["decode"]["passed"] and not broken["passed"]
    assert broken["logits"]["passed"]  # the full-context checks cannot see it


@pytest.mark.parametrize("backend", ["sdpa_math", "control_energy"])
def test_a_backend_without_a_kv_cache_path_is_skipped_with_the_reason(backend):
    cell = ModelCell("t", "llama_tiny", backend, "fp32", "decode", 48, 1)
    record = run_model_cell(cell, model_cell_spec(timed_steps=3)).record
    assert record["status"] == "skipped" and "reads a KV cache" in record["reason"]


def test_decode_flops_count_one_token_per_sequence_over_the_whole_context():
    model = build_model(model_spec("llama_tiny"), "fp32", CPU, 0)
    shape = shape_of(model.config)
    flops = step_flops(shape, 1000, batch=4, seq_len=63, phase="decode")
    attention = 4 * shape.layers * 64 * shape.heads * shape.head_dim * 4  # 63 cached keys and its own, not halved
    assert flops["attention"] == attention
    assert flops["total"] == 2 * 1000 * 4 + 2 * shape.vocab * shape.hidden * 4 + attention
    assert flops["per_token"] == flops["total"] / 4


def test_a_decode_grid_leaves_out_compiled_and_multi_gpu_cells():
    config = validate_config({"suites": {"m": {"models": {"grids": [{
        "models": ["llama_3_2_1b"], "backends": ["sdpa_default"], "precisions": ["bf16"], "phases": ["decode"],
        "seq_lens": [4096], "batches": [1, 16], "compiled": [False, True], "gpus": [1, 2], "strategies": ["fsdp"]}]}}}})
    cells = list(model_runs(config, "m"))
    assert {(c.batch, c.compiled, c.gpus) for c in cells} == {(1, False, 1), (16, False, 1)}
    with pytest.raises(ValueError, match="decode: a decode step runs on one GPU, uncompiled"):
        ModelCell("m", "llama_3_2_1b", "sdpa_default", "bf16", "decode", 4096, 1, compiled=True)

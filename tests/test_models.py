"""Model-level cells on the CPU: the presets against their model cards, the adapter that
plugs a backend into transformers (mask registration included), the model check, the FLOP
count, the cell and its suite, a whole cell's job, and the table and figures."""
from __future__ import annotations

import copy
import math
import re

import pandas as pd
import pytest
import torch
import transformers

from flashwatt.attention.cell import Cell
from flashwatt.config import ConfigError, load_config, validate_config
from flashwatt.kinds import every_cell
from flashwatt.kernels import get_kernel
from flashwatt.kernels.base import UnsupportedCell
from flashwatt.models import attention, cell as model_cell
from flashwatt.models.attention import BACKENDS, use_backend
from flashwatt.models.cell import ModelCell
from flashwatt.models.check import check_model
from flashwatt.models.figures import MODEL_FIGURES
from flashwatt.models.flops import dense_peak_tflops, step_flops, step_utilisation
from flashwatt.models.job import run_model_cell
from flashwatt.models.presets import PRESETS, build_config, model_spec, shape_of
from flashwatt.models.step import body_matmul_parameters, build_model, reference_factory
from flashwatt.models.suite import model_runs
from flashwatt.models.summary import model_table
from flashwatt.records import write_record
from support import model_cell_spec

CPU = torch.device("cpu")


def meta_model(name: str):
    with torch.device("meta"):
        return transformers.AutoModelForCausalLM.from_config(build_config(model_spec(name)))


# ---- presets --------------------------------------------------------------------------
@pytest.mark.parametrize("name", [n for n, p in PRESETS.items() if p.published_parameters])
def test_every_preset_has_its_model_cards_parameter_count(name):
    model = meta_model(name)
    assert sum(p.numel() for p in model.parameters()) == PRESETS[name].published_parameters


# (hidden, layers, heads, K/V heads, FFN, vocab, tied) as the issue lists them from the model cards
PUBLISHED = {
    "llama_3_2_1b": (2048, 16, 32, 8, 8192, 128256, True),
    "llama_3_2_3b": (3072, 28, 24, 8, 8192, 128256, True),
    "llama_2_7b": (4096, 32, 32, 32, 11008, 32000, False),
    "llama_3_8b": (4096, 32, 32, 8, 14336, 128256, False),
}


@pytest.mark.parametrize("name", PUBLISHED)
def test_llama_presets_have_the_published_shape(name):
    config = build_config(model_spec(name))
    got = (config.hidden_size, config.num_hidden_layers, config.num_attention_heads, config.num_key_value_heads,
           config.intermediate_size, config.vocab_size, config.tie_word_embeddings)
    assert got == PUBLISHED[name]


def test_gpt2_preset_is_the_124m_model():
    shape = shape_of(build_config(model_spec("gpt2_124m")))
    assert (shape.hidden, shape.layers, shape.heads, shape.vocab, shape.max_positions) == (768, 12, 12, 50257, 1024)


def test_a_suite_may_name_its_own_model_by_shape_or_folder(tmp_path):
    assert model_spec("mine", {"mine": {"family": "gpt2", "n_embd": 64}})["settings"] == {"n_embd": 64}
    assert model_spec("real", {"real": {"path": str(tmp_path)}})["path"] == str(tmp_path)
    with pytest.raises(ValueError, match="no config.json"):
        build_config(model_spec("real", {"real": {"path": str(tmp_path)}}))
    with pytest.raises(ValueError, match=r"config key k: unknown model 'llama_9b'; presets: llama_3_2_1b"):
        model_spec("llama_9b", where="k")


# ---- the adapter ----------------------------------------------------------------------
def test_the_cell_lists_the_adapters_backends():
    assert model_cell.MODEL_BACKENDS == BACKENDS


def test_no_registered_name_makes_transformers_look_for_the_flash_attn_package():
    # transformers reads any name with "flash" in it as a request for that package
    assert all("flash" not in attention.registered_name(b) for b in attention.REGISTRY)


@pytest.mark.parametrize("kernel", ["naive", "sdpa_math"])
def test_kernels_run_grouped_query_attention(kernel):
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(2, 8, 32, 16, generator=gen)
    k, v = torch.randn(2, 2, 32, 16, generator=gen), torch.randn(2, 2, 32, 16, generator=gen)
    cell = Cell("t", kernel, "fp32", 32, 2, 8, 16, causal=True)
    out = get_kernel(kernel)(q, k, v, cell)
    expected = torch.nn.functional.scaled_dot_product_attention(
        q.double(), k.double().repeat_interleave(4, 1), v.double().repeat_interleave(4, 1), is_causal=True)
    assert out.shape == q.shape
    assert torch.allclose(out.double(), expected, atol=1e-5)


@pytest.fixture(scope="module", params=["llama_tiny", "gpt2_tiny"])
def tiny(request):
    return build_model(model_spec(request.param), "fp32", CPU, seed=0)


@pytest.mark.parametrize("backend", ["eager", "sdpa_default", "sdpa_math"])
@pytest.mark.parametrize("train", [False, True])
def test_every_cpu_backend_computes_the_model(tiny, backend, train):
    use_backend(tiny, backend, "fp32", train)
    result = check_model(tiny, reference_factory(tiny, CPU), "fp32", tiny.config.vocab_size, train, seed=0)
    assert result["passed"], result
    assert result["logits"]["error"] < 1e-5 and result["causal"]["prefix_change"] == 0
    assert ("grad" in result) == train


def test_a_backend_registered_without_its_mask_function_fails_the_causality_check(tiny):
    """transformers gives a name with no mask function no causal mask, silently."""
    from transformers import AttentionInterface

    use_backend(tiny, "eager", "fp32", False)
    function, _ = attention.current_function(tiny)
    AttentionInterface.register("unmasked_eager", function)
    tiny.set_attn_implementation("unmasked_eager")
    try:
        result = check_model(tiny, reference_factory(tiny, CPU), "fp32", tiny.config.vocab_size, False, seed=0)
    finally:
        tiny.set_attn_implementation("eager")
    assert not result["causal"]["passed"] and not result["passed"]
    assert result["causal"]["prefix_change"] > 1e-3 * result["causal"]["suffix_change"]


def test_a_registry_backend_that_ignored_causality_would_fail(tiny, monkeypatch):
    adapter = use_backend(tiny, "sdpa_math", "fp32", False)
    real = adapter.attention_call
    monkeypatch.setattr(adapter, "attention_call",
                        lambda B, H, L, D, causal, kv_heads: real(B, H, L, D, False, kv_heads))
    result = check_model(tiny, reference_factory(tiny, CPU), "fp32", tiny.config.vocab_size, False, seed=0)
    assert not result["causal"]["passed"] and not result["logits"]["passed"]


class CompiledLike:
    """Calls the model as torch.compile's wrapper does, and like it refuses len()."""

    def __init__(self, model):
        self.model, self.calls = model, 0

    def __call__(self, **kwargs):
        self.calls += 1
        return self.model(**kwargs)

    def __len__(self):
        raise TypeError("LlamaForCausalLM does not support len()")


def test_a_compiled_step_is_checked_through_its_own_forward(tiny):
    use_backend(tiny, "sdpa_default", "fp32", True)
    forward = CompiledLike(tiny)
    result = check_model(tiny, reference_factory(tiny, CPU), "fp32", tiny.config.vocab_size, True, seed=0,
                         forward=forward)
    assert result["passed"] and forward.calls == 3  # the checked step, and both forwards of the causality probe


def test_a_registry_backend_refuses_a_padded_batch_instead_of_dropping_the_mask(tiny):
    use_backend(tiny, "sdpa_math", "fp32", False)
    ids = torch.randint(0, 100, (2, 16))
    mask = torch.ones(2, 16, dtype=torch.long)
    mask[0, :4] = 0
    with pytest.raises(UnsupportedCell, match="unpadded sequences only"):
        tiny(input_ids=ids, attention_mask=mask)


# ---- FLOPs ----------------------------------------------------------------------------
def test_the_flop_count_gives_the_measured_anchors_mfu():
    """Llama-3.2-1B, B2 L4096, train step of 189 ms on an H100: MFU 36% (MEASUREMENT.md)."""
    model = meta_model("llama_3_2_1b")
    shape = shape_of(model.config)
    body = body_matmul_parameters(model)
    assert body + shape.vocab * shape.hidden == pytest.approx(1.236e9, rel=1e-3)  # tied head counted as a matmul
    flops = step_flops(shape, body, 2, 4096, "train")
    assert flops["total"] / 0.189 / 1e12 / dense_peak_tflops("NVIDIA H100 80GB HBM3", "bf16") == pytest.approx(0.36, abs=0.005)
    # attention term: 3 x 4 x layers x L x heads x head_dim per token, halved for causal
    assert flops["attention"] == 3 * 2 * 16 * 4096 * 32 * 64 * 8192
    prefill = step_flops(shape, body, 1, 4096, "prefill", logits_of_last_only=True)
    assert prefill["total"] == 2 * body * 4096 + 2 * shape.vocab * shape.hidden + 2 * 16 * 4096 * 32 * 64 * 4096
    assert dense_peak_tflops("Tesla T4", "bf16") is None
    # what a job records from its measured step: the same MFU; over 2 GPUs, the peak of both
    measured = step_utilisation(shape, body, 2, 4096, "train", 0.189, "NVIDIA H100 80GB HBM3", "bf16")
    assert measured["mfu"] == pytest.approx(0.36, abs=0.005) and "peak_of" not in measured
    pair = step_utilisation(shape, body, 2, 4096, "train", 0.189, "NVIDIA H100 80GB HBM3", "bf16", gpus=2)
    assert pair["mfu"] == pytest.approx(measured["mfu"] / 2) and pair["peak_of"] == "2 GPUs"
    assert step_utilisation(shape, body, 1, 4096, "prefill", 0.1, None, "bf16")["total"] == prefill["total"]
    assert step_utilisation(shape, body, 1, 4096, "prefill", 0.1, None, "bf16")["mfu"] is None


# ---- cells and the suite ----------------------------------------------------------------
@pytest.mark.parametrize("cell", [ModelCell("s", "llama_3_2_1b", "custom", "bf16", "train", 4096, 2, True, True),
                                  ModelCell("s", "gpt2_124m", "sdpa_default", "fp32", "prefill", 1024, 16)])
def test_a_model_cell_is_found_again_from_its_path(cell):
    assert ModelCell.from_path(cell.path) == cell
    assert cell.path.startswith(f"results/cells/s/model/{cell.model}/{cell.backend}/{cell.precision}/")


def test_model_cell_names_say_what_runs():
    cell = ModelCell("s", "llama_3_2_1b", "custom", "bf16", "train", 4096, 2, True, True)
    assert cell.name == "train-L4096-B2-recompute-compiled" and cell.tokens == 8192
    with pytest.raises(ValueError, match="recompute: activation checkpointing applies to train steps only"):
        ModelCell("s", "llama_3_2_1b", "custom", "bf16", "prefill", 4096, 1, recompute=True)
    with pytest.raises(ValueError, match="backend='flash2'"):
        ModelCell("s", "llama_3_2_1b", "flash2", "bf16", "prefill", 4096, 1)


@pytest.mark.parametrize("recompute, suffix, share", [
    (False, "", 0), (0, "", 0), (True, "-recompute", 100), (100, "-recompute", 100), (50, "-recompute50", 50),
    (1, "-recompute1", 1), (99, "-recompute99", 99)])
def test_a_recompute_share_names_its_cell_and_is_found_again(recompute, suffix, share):
    """true/false keep the names cells always had (their records stay valid); a share 1-99
    names its percent, and every name reads back as the same cell with the same percent."""
    cell = ModelCell("s", "llama_3_8b", "sdpa_default", "bf16", "train", 8192, 1, recompute, gpus=4, strategy="fsdp")
    assert cell.name == f"train-L8192-B1{suffix}-G4-fsdp" and cell.recompute == share
    assert cell.as_row()["recompute"] == share
    again = ModelCell.from_path(cell.path)
    assert again == cell and again.recompute == share and again.name == cell.name


def test_true_and_100_are_one_cell_and_a_share_is_no_other_name():
    every = ModelCell("s", "llama_3_8b", "sdpa_default", "bf16", "train", 8192, 1, True)
    assert every == ModelCell("s", "llama_3_8b", "sdpa_default", "bf16", "train", 8192, 1, 100)
    assert len({every, ModelCell("s", "llama_3_8b", "sdpa_default", "bf16", "train", 8192, 1, 100)}) == 1
    for name in ("train-L8192-B1-recompute100", "train-L8192-B1-recompute0", "train-L8192-B1-recompute050"):
        with pytest.raises(ValueError, match="is not a ModelCell record"):
            ModelCell.from_path(f"results/cells/s/model/llama_3_8b/sdpa_default/bf16/{name}.json")


@pytest.mark.parametrize("bad", [150, 0.5, -1, "50", None])
def test_a_recompute_that_is_no_share_is_refused_saying_what_is(bad):
    with pytest.raises(ValueError, match=re.escape(f"model cell recompute: {bad!r} is not allowed; give a whole "
                                                   "percent of the decoder blocks, 1-100")):
        ModelCell("s", "llama_3_8b", "sdpa_default", "bf16", "train", 8192, 1, bad)


def grid(**over):
    return {"models": ["llama_3_2_1b"], "backends": ["sdpa_default", "custom"], "precisions": ["bf16"],
            "phases": ["prefill", "train"], "seq_lens": [4096], "batches": [1], "recompute": [False, True], **over}


def test_the_models_section_expands_to_cells_leaving_out_prefill_with_recompute():
    config = validate_config({"suites": {"m": {"models": {"grids": [grid()], "steps": {"timed_steps": 4}}}}})
    cells = model_runs(config, "m", {"seed": 3})
    assert len(cells) == 2 * 3  # prefill, train, train+recompute for each backend
    assert not any(c.recompute and c.phase == "prefill" for c in cells)
    spec = next(iter(cells.values()))
    assert spec["model"]["family"] == "llama" and spec["steps"]["timed_steps"] == 4 and spec["seed"] == 3


def test_a_grid_takes_recompute_as_true_false_or_a_share_each_once():
    config = validate_config({"suites": {"m": {"models": {"grids": [grid(recompute=[True, 100, 50, False, 0])]}}}})
    cells = model_runs(config, "m")
    assert len(cells) == 2 * (1 + 3)  # prefill without recompute; train at 0, 50 and 100 percent
    assert sorted(c.recompute for c in cells if c.phase == "train") == [0, 0, 50, 50, 100, 100]
    assert {c.name for c in cells} == {"prefill-L4096-B1", "train-L4096-B1", "train-L4096-B1-recompute50",
                                       "train-L4096-B1-recompute"}


@pytest.mark.parametrize("over, message", [
    ({"models": ["llama_9b"]}, r"suites.m.models.grids\[0\].models\[0\]: unknown model 'llama_9b'"),
    ({"recompute": [True, 150]}, r"config key suites.m.models.grids\[0\].recompute\[1\]: 150 is not allowed; give "
                                 r"a whole percent of the decoder blocks, 1-100 \(e.g. 50; 0 is none\), or "
                                 r"true/false"),
    ({"recompute": [0.5]}, r"config key suites.m.models.grids\[0\].recompute\[0\]: 0.5 is not allowed; give a "
                           r"whole percent"),
    ({"recompute": ["half"]}, r"config key suites.m.models.grids\[0\].recompute\[0\]: 'half' is not of type"),
    ({"models": ["gpt2_124m"], "seq_lens": [2048]},
     r"suites.m.models.grids\[0\].seq_lens: 2048 is longer than model gpt2_124m's 1024 positions"),
    ({"backends": ["flash3"]}, r"suites.m.models.grids\[0\].backends\[0\]: 'flash3' is not allowed"),
])
def test_a_bad_models_section_names_its_key(over, message):
    with pytest.raises(ConfigError, match=message):
        validate_config({"suites": {"m": {"models": {"grids": [grid(**over)]}}}})


def test_the_shipped_models_suite_covers_every_preset_backend_and_phase():
    config = load_config("config/config.yaml")
    cells = model_runs(config, "models")
    assert {c.model for c in cells} == {"llama_3_2_1b", "llama_3_2_3b", "llama_2_7b", "llama_3_8b", "gpt2_124m"}
    assert {c.backend for c in cells} >= {"eager", "sdpa_default", "sdpa_flash", "sdpa_cudnn", "custom"}
    assert {c.phase for c in cells} == {"prefill", "train", "decode"}
    assert any(c.compiled for c in cells) and any(c.recompute for c in cells)
    assert every_cell(config, "models") == list(cells)


# ---- the job ----------------------------------------------------------------------------


def test_a_train_cell_on_cpu_is_checked_timed_and_counted():
    cell = ModelCell("t", "llama_tiny", "sdpa_math", "fp32", "train", 64, 2, recompute=True)
    record = run_model_cell(cell, model_cell_spec()).record
    assert record["status"] == "ok", record.get("traceback")
    assert record["check"]["passed"] and record["check"]["grad"]["block"] == "model.layers.1"
    timing = record["timing"]
    assert timing["forward_ms"] > 0 and timing["backward_ms"] > 0 and timing["optimizer_ms"] > 0
    assert len(timing["steps_ms"]) == 2 and timing["tokens_per_s"] == pytest.approx(128 / (timing["step_ms"] / 1e3))
    assert record["flops"]["formula"].startswith("forward FLOPs = 2*N_matmul*tokens")
    assert record["flops"]["mfu"] is None  # no datasheet peak for a CPU
    assert record["energy"]["reason"].startswith("no CUDA device")
    assert record["model"]["shape"]["kv_heads"] == 2
    assert record["memory"]["recompute"] == 100 and record["memory"]["recomputed_blocks"] == [0, 1]


def _train_step_of_four_blocks(share: int):
    """One training step of a four-block tiny Llama built as a model cell recomputing
    `share` percent of its blocks: the blocks checkpointed, each block's attention calls
    in the step (a pre-hook: the forward and, where recomputed, the backward's rerun) and
    the gradients the optimizer was given."""
    from flashwatt.models.fsdp import decoder_blocks
    from flashwatt.models.recompute import checkpointed_blocks
    from flashwatt.models.step import make_step

    model = build_model(model_spec("llama_tiny"), "fp32", CPU, seed=0, num_hidden_layers=4)
    calls = [0] * 4
    for i, block in enumerate(decoder_blocks(model)):
        block.self_attn.register_forward_pre_hook(lambda module, args, i=i: calls.__setitem__(i, calls[i] + 1))
    step = make_step(model, ModelCell("t", "llama_tiny", "sdpa_math", "fp32", "train", 32, 2, recompute=share),
                     CPU, seed=0)
    grads = {}
    step.optimizer.step = lambda: grads.update({n: p.grad.clone() for n, p in model.named_parameters()})
    step.run()
    return checkpointed_blocks(model), calls, grads


@pytest.mark.parametrize("share, blocks", [(50, [1, 3]), (25, [3]), (100, [0, 1, 2, 3])])
def test_a_train_step_recomputing_a_share_reruns_exactly_those_blocks_with_the_same_gradients(share, blocks):
    from flashwatt.models.recompute import recomputed_blocks

    assert recomputed_blocks(4, share) == blocks
    none, calls_without, reference = _train_step_of_four_blocks(0)
    assert none == [] and calls_without == [1, 1, 1, 1]
    checkpointed, calls, grads = _train_step_of_four_blocks(share)
    assert checkpointed == blocks
    assert calls == [2 if i in blocks else 1 for i in range(4)]
    assert grads.keys() == reference.keys() and len(grads) == 38
    for name, grad in grads.items():
        torch.testing.assert_close(grad, reference[name], rtol=0, atol=0, msg=name)


@pytest.mark.parametrize("cell, reason", [
    (ModelCell("t", "llama_tiny", "custom", "fp32", "prefill", 64, 1), "custom needs a CUDA device"),
    (ModelCell("t", "llama_tiny", "eager", "bf16", "prefill", 64, 1), "on CPU the models run fp32 only"),
    (ModelCell("t", "llama_tiny", "eager", "fp32", "prefill", 4096, 1), "longer than llama_tiny's 2048 positions"),
])
def test_a_cell_that_cannot_run_here_is_skipped_with_the_reason(cell, reason):
    record = run_model_cell(cell, model_cell_spec()).record
    assert record["status"] == "skipped" and reason in record["reason"]


def test_running_out_of_memory_is_a_recorded_outcome_naming_the_stage(monkeypatch):
    import flashwatt.models.step as step

    def no_room(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 4.00 GiB")

    monkeypatch.setattr(step, "make_step", no_room)
    record = run_model_cell(ModelCell("t", "llama_tiny", "eager", "fp32", "train", 64, 2), model_cell_spec()).record
    assert record["status"] == "oom" and record["oom_stage"] == "build"
    assert record["model"]["parameters"] > 0  # what was learnt before is kept


# ---- table and figures --------------------------------------------------------------------
@pytest.fixture(scope="module")
def table(tmp_path_factory):
    folder = tmp_path_factory.mktemp("records")
    paths = []
    for backend in ("sdpa_default", "eager", "custom"):
        cell = ModelCell("t", "gpt2_tiny", backend, "fp32", "prefill", 64, 2)
        path = folder / cell.path
        write_record(path, run_model_cell(cell, model_cell_spec("gpt2_tiny")).record)
        paths.append(path)
    return model_table(paths)


def test_the_table_compares_each_backend_with_the_sdpa_default(table):
    rows = table.set_index("backend")
    assert rows.loc["sdpa_default", "speedup_vs_sdpa_default"] == 1.0
    assert rows.loc["eager", "speedup_vs_sdpa_default"] == pytest.approx(
        rows.loc["eager", "tokens_per_s"] / rows.loc["sdpa_default", "tokens_per_s"])
    assert rows.loc["custom", "status"] == "skipped" and math.isnan(rows.loc["custom", "speedup_vs_sdpa_default"])
    assert rows.loc["eager", "check_passed"] and rows.loc["eager", "causal_passed"]


def test_the_table_says_how_busy_the_gpu_was_over_the_energy_window(tmp_path):
    """NVML's utilisation over the window comes through, so a host-bound step shows as one."""
    cell = ModelCell("t", "gpt2_tiny", "sdpa_default", "fp32", "prefill", 64, 2)
    record = run_model_cell(cell, model_cell_spec("gpt2_tiny")).record
    record["energy"] = {"available": True, "j_per_token": 0.5, "gpu_util_pct": 21.5, "window_s": 3.0}
    write_record(tmp_path / cell.path, record)
    row = model_table([tmp_path / cell.path]).iloc[0]
    assert row["gpu_util_pct"] == 21.5 and row["j_per_token"] == 0.5


def test_every_model_figure_draws_or_says_why(table):
    from flashwatt.models.governed_figures import GovernedTables
    from flashwatt.models.summary import governed_traces

    nothing = table.assign(status="skipped", reason="custom needs a CUDA device (running on cpu)")
    for name, figure in MODEL_FIGURES.items():
        data = nothing if figure.source.inputs == ("table",) else GovernedTables(nothing, governed_traces([]))
        text = " ".join(t.get_text() for ax in figure.render(data).axes for t in ax.texts)
        # the table holds prefill cells, and none governed
        expected = {"model_memory": "no train cells", "model_governed_power": "no model cell with a budget"}.get(
            name, "CUDA device")
        assert text.startswith("Nothing to draw.") and expected in text, (name, text)
    figure = MODEL_FIGURES["model_throughput"].render(table)
    assert figure.axes and any(len(ax.patches) for ax in figure.axes)


def test_the_figures_name_each_recompute_share(table):
    """Train rows recomputing no block, half of them and all: the memory figure's styles
    and the throughput figure's cells name each, and a table from before shares (true/false)
    reads the same."""
    ok = table[table["backend"] == "sdpa_default"].iloc[0]
    rows = [ok.copy() for _ in range(3)]
    for row, share in zip(rows, (0, 50, 100)):
        row["phase"], row["recompute"], row["peak_allocated_bytes"] = "train", share, (3 - share / 50) * 2**30
    train = pd.DataFrame(rows)
    memory = MODEL_FIGURES["model_memory"].render(train)
    legend = {t.get_text() for legend in memory.legends for t in legend.get_texts()}
    assert {"no recompute", "recompute 50%", "recompute"} <= legend, legend
    throughput = MODEL_FIGURES["model_throughput"].render(train)
    labels = " ".join(t.get_text() for ax in throughput.axes for t in ax.get_yticklabels())
    assert "fp32 recompute 50%" in labels and labels.count("recompute") == 2, labels
    old = train[train["recompute"] != 50].assign(recompute=lambda t: t["recompute"] > 0)
    legend = {t.get_text() for legend in MODEL_FIGURES["model_memory"].render(old).legends for t in legend.get_texts()}
    assert {"no recompute", "recompute"} <= legend, legend

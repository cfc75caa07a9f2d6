"""Model cells whose attention is the power-aware controller's (backend control_energy or
control_<W>w), on the CPU: their names and config, the adapter that hands every attention
call of a transformers model to a controller, the settling before timing, and the job's
refusal where no GPU is. The controller itself needs a GPU and NVML: tests/gpu/test_models_gpu.py."""
from __future__ import annotations

import time

import pytest
import torch
import torch.nn.functional as F

from flashwatt.config import ConfigError, validate_config
from flashwatt.kernels.base import UnsupportedCell
from flashwatt.models.cell import ModelCell
from flashwatt.models.check import check_model
from flashwatt.models.controlled_attention import calls_between, settle, use_controller
from flashwatt.models.job import run_model_cell
from flashwatt.models.step_defaults import DEFAULT_SETTLE_S
from flashwatt.models.presets import model_spec
from flashwatt.models.step import build_model, reference_factory
from flashwatt.models.suite import model_runs

CPU = torch.device("cpu")


# ---- names ------------------------------------------------------------------------------
@pytest.mark.parametrize("backend, control", [("control_energy", ("energy", None)), ("control_450w", ("budget", 450.0))])
def test_a_controller_cell_names_its_mode_and_is_found_from_its_path(backend, control):
    cell = ModelCell("s", "llama_3_2_1b", backend, "bf16", "prefill", 4096, 1)
    assert cell.control == control
    assert ModelCell.from_path(cell.path) == cell
    assert f"/model/llama_3_2_1b/{backend}/bf16/prefill-L4096-B1.json" in cell.path
    assert ModelCell("s", "llama_3_2_1b", "custom", "bf16", "prefill", 4096, 1).control is None


@pytest.mark.parametrize("backend, gpus, strategy, compiled, message", [
    ("control_fast", 1, "none", False, "backend='control_fast': allowed eager"),
    ("control_0w", 1, "none", False, "control_<watts>w"),
    ("control_energy", 2, "fsdp", False, "runs on one GPU and without torch.compile"),
    ("control_300w", 1, "none", True, "runs on one GPU and without torch.compile"),
])
def test_a_controller_cell_that_cannot_be_is_refused(backend, gpus, strategy, compiled, message):
    with pytest.raises(ValueError, match=message):
        ModelCell("s", "llama_3_2_1b", backend, "bf16", "train", 4096, 1, compiled=compiled, gpus=gpus,
                  strategy=strategy)


# ---- config -----------------------------------------------------------------------------
def grid(**over):
    return {"models": ["llama_3_2_1b"], "backends": ["sdpa_default", "control_energy", "control_450w"],
            "precisions": ["bf16"], "phases": ["prefill"], "seq_lens": [4096], "batches": [1],
            "compiled": [False, True], **over}


def test_controller_backends_expand_on_one_gpu_uncompiled_and_only_they_get_the_settle_time():
    config = validate_config({"suites": {"m": {"models": {"grids": [grid()], "steps": {"control_settle_s": 12}}}}})
    cells = model_runs(config, "m")
    controlled = [c for c in cells if c.control]
    assert sorted(c.backend for c in controlled) == ["control_450w", "control_energy"]
    assert not any(c.compiled for c in controlled)
    assert {c.compiled for c in cells if not c.control} == {False, True}
    for cell, spec in cells.items():
        assert ("control_settle_s" in spec["steps"]) == bool(cell.control)
    assert cells[controlled[0]]["steps"]["control_settle_s"] == 12


def test_the_settle_time_defaults_and_other_cells_specs_do_not_move():
    plain = validate_config({"suites": {"m": {"models": {"grids": [grid(backends=["custom"])]}}}})
    tuned = validate_config({"suites": {"m": {"models": {"grids": [grid(backends=["custom"])],
                                                         "steps": {"control_settle_s": 5}}}}})
    assert model_runs(plain, "m") == model_runs(tuned, "m")
    default = model_runs(validate_config({"suites": {"m": {"models": {"grids": [grid()]}}}}), "m")
    assert {s["steps"]["control_settle_s"] for c, s in default.items() if c.control} == {DEFAULT_SETTLE_S}


def test_an_unknown_controller_backend_names_its_key_and_what_is_allowed():
    with pytest.raises(ConfigError, match=r"suites.m.models.grids\[0\].backends\[1\]: 'control_max' is not allowed; "
                                          r"allowed: eager, .*custom, a name matching \^control_"):
        validate_config({"suites": {"m": {"models": {"grids": [grid(backends=["custom", "control_max"])]}}}})


# ---- the adapter --------------------------------------------------------------------------
class StandInController:
    """What the adapter needs of a Controller: `attention(q, k, v, causal)`; computes real
    attention (or, with `ignore_causal`, forgets the mask) and keeps what it was given."""

    def __init__(self, ignore_causal: bool = False):
        self.ignore_causal = ignore_causal
        self.calls: list[tuple] = []

    def attention(self, q, k, v, causal=False):
        self.calls.append((tuple(q.shape), tuple(k.shape), causal, q.dtype))
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal and not self.ignore_causal,
                                              enable_gqa=k.shape[1] != q.shape[1])


@pytest.fixture(scope="module")
def llama():
    return build_model(model_spec("llama_tiny"), "fp32", CPU, seed=0)


@pytest.mark.parametrize("train", [False, True])
def test_every_attention_call_goes_to_the_controller_unexpanded_and_causal(llama, train):
    controller = StandInController()
    use_controller(llama, controller)
    result = check_model(llama, reference_factory(llama, CPU), "fp32", llama.config.vocab_size, train, seed=0)
    assert result["passed"], result
    assert result["logits"]["error"] < 1e-5 and result["causal"]["prefix_change"] == 0
    heads, kv_heads = llama.config.num_attention_heads, llama.config.num_key_value_heads
    assert kv_heads < heads
    assert controller.calls and all(q[1] == heads and k[1] == kv_heads and causal for q, k, causal, _ in controller.calls)


def test_a_controller_that_dropped_the_mask_fails_the_check(llama):
    use_controller(llama, StandInController(ignore_causal=True))
    result = check_model(llama, reference_factory(llama, CPU), "fp32", llama.config.vocab_size, False, seed=0)
    assert not result["causal"]["passed"] and not result["passed"]


def test_the_controller_is_not_handed_a_padded_batch(llama):
    use_controller(llama, StandInController())
    tokens = torch.randint(0, llama.config.vocab_size, (2, 16))
    mask = torch.ones(2, 16, dtype=torch.long)
    mask[1, :4] = 0
    with pytest.raises(UnsupportedCell, match="the controller takes unpadded sequences only"):
        llama(input_ids=tokens, attention_mask=mask)


# ---- settling -----------------------------------------------------------------------------
class Exploring:
    """A controller that explores for its first `calls` steps."""

    def __init__(self, calls: int | None):
        self.left = calls

    @property
    def exploring(self) -> bool:
        return self.left is None or self.left > 0

    def step(self):
        if self.left:
            self.left -= 1

    def choices(self):
        return {"shape": "custom"}

    def call_counts(self):
        return {"custom": 7}


class Steps:
    def __init__(self, controller):
        self.controller, self.count = controller, 0

    def run(self):
        self.count += 1
        self.controller.step()


def test_settling_runs_until_the_choice_has_held_for_some_steps():
    controller = Exploring(4)
    steps = Steps(controller)
    out = settle(steps, controller, lambda: None, settle_s=60, hold_s=0.0, min_steps=3)
    assert steps.count == 4 + 3 == out["steps"]
    assert out["settled"] and out["choices"] == {"shape": "custom"} and out["calls"] == {"custom": 7}


def test_settling_waits_for_the_choice_to_hold_and_starts_over_when_it_changes():
    class Switching(Exploring):
        def __init__(self):
            super().__init__(0)
            self.n = 0

        def step(self):
            self.n += 1

        def choices(self):  # changes its mind at step 5, then holds
            return {"shape": "custom" if self.n < 5 else "sdpa_flash"}

    controller = Switching()
    steps = Steps(controller)
    out = settle(steps, controller, lambda: time.sleep(0.01), settle_s=60, hold_s=0.1, min_steps=3)
    assert out["settled"] and out["choices"] == {"shape": "sdpa_flash"}
    # After the switch at step 5 the choice must hold for min_steps steps and hold_s seconds:
    # counted in steps and seconds, not in steps per second (which a loaded machine changes).
    assert steps.count >= 5 + 3 and out["seconds"] >= 0.1


def test_settling_gives_up_at_its_limit_and_says_so():
    controller = Exploring(None)
    out = settle(Steps(controller), controller, lambda: None, settle_s=0.01)
    assert not out["settled"] and out["seconds"] >= 0.01 and out["limit_s"] == 0.01


def test_calls_between_two_snapshots_count_only_what_ran_between():
    assert calls_between({"custom": 5, "sdpa_cudnn": 2}, {"custom": 9, "sdpa_cudnn": 2, "sdpa_flash": 1}) == \
        {"custom": 4, "sdpa_flash": 1}


# ---- the job ------------------------------------------------------------------------------
def test_a_controller_cell_without_a_gpu_is_skipped_with_the_reason():
    cell = ModelCell("t", "llama_tiny", "control_energy", "fp32", "prefill", 64, 1)
    spec = {"model": model_spec("llama_tiny"), "seed": 0, "steps": {"warmup_steps": 1, "timed_steps": 2},
            "measure": {"energy": False}}
    record = run_model_cell(cell, spec).record
    assert record["status"] == "skipped"
    assert record["reason"] == "control_energy: the controller runs on a CUDA device (running on cpu)"


# ---- the table ------------------------------------------------------------------------------
def test_the_table_shows_what_the_controller_ran_and_compares_it_with_the_default(tmp_path):
    from flashwatt.models.summary import model_table
    from flashwatt.records import write_record

    def record(tokens_per_s, j_per_token, check, control=None):
        return {"status": "ok", "timing": {"tokens_per_s": tokens_per_s, "step_ms": 25.0},
                "energy": {"j_per_token": j_per_token}, "check": check, **({"control": control} if control else {})}

    one = {"passed": True, "logits": {"error": 0.01, "tolerance": 0.05}, "causal": {"passed": True}}
    worse = {"passed": True, "logits": {"error": 0.02, "tolerance": 0.05}, "causal": {"passed": True}}
    cells = {"sdpa_default": record(100.0, 4.0, one),
             "control_energy": record(102.0, 3.8, {"passed": True, "configurations": {"custom": one, "sdpa_cudnn": worse}},
                                      {"measured_calls": {"custom": 96, "sdpa_cudnn": 32},
                                       "settle": {"seconds": 5.5, "settled": True}})}
    paths = []
    for backend, rec in cells.items():
        path = tmp_path / ModelCell("t", "llama_3_2_1b", backend, "bf16", "prefill", 4096, 1).path
        write_record(path, rec)
        paths.append(path)
    row = model_table(paths).set_index("backend").loc["control_energy"]
    assert row["control_configurations"] == "custom 75%, sdpa_cudnn 25%"
    assert row["logits_error"] == 0.02 and bool(row["causal_passed"]) and row["control_settle_s"] == 5.5
    assert row["speedup_vs_sdpa_default"] == pytest.approx(1.02) and row["energy_vs_sdpa_default"] == pytest.approx(0.95)

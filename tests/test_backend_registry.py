"""The backend registry: every list of backend names derives from its declarations, its
rules answer before any tensor exists, and a backend registered once is seen by every
kind of cell, as far as its declaration allows."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from flashwatt.attention.cell import Cell
from flashwatt.kernels import AttentionCall, Backend, DeclaredKernel, get_kernel, registry
from flashwatt.kernels.declaration import load

CPU, CUDA = torch.device("cpu"), torch.device("cuda", 0)


def run_python(code: str) -> str:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env).stdout


# ---- the lists the cells, records and schema use ----------------------------------------
def test_every_list_of_names_derives_from_the_declarations():
    from flashwatt import vocabulary
    from flashwatt.control import configuration
    from flashwatt.distributed import blocks, cell as distributed
    from flashwatt.models import attention, cell as models, cp_attention
    from flashwatt.training import cell as training

    assert vocabulary.KERNEL_NAMES == ("naive", "sdpa_math", "sdpa_flash", "sdpa_efficient", "sdpa_cudnn",
                                       "sdpa_default", "custom")
    assert models.MODEL_BACKENDS == ("eager", "sdpa_default", "sdpa_math", "sdpa_flash", "sdpa_efficient",
                                     "sdpa_cudnn", "custom") == attention.BACKENDS
    assert training.WILDCARD_CONSTRAINTS["tbackend"] == "|".join(models.MODEL_BACKENDS)
    assert attention.REGISTRY == ("sdpa_math", "sdpa_flash", "sdpa_efficient", "sdpa_cudnn", "custom")
    assert set(distributed.BLOCKS) == {"auto", "math", "flash", "efficient", "cudnn", "custom"}
    assert blocks.BLOCK_NAMES == distributed.BLOCKS
    assert cp_attention.BLOCK_OF_BACKEND == {"sdpa_math": "math", "sdpa_flash": "flash", "sdpa_efficient": "efficient",
                                             "sdpa_cudnn": "cudnn", "sdpa_default": "auto", "custom": "custom"}
    # the controller starts from the first: our kernel
    assert configuration.CONTROL_BACKENDS == ("custom", "sdpa_cudnn", "sdpa_flash", "sdpa_efficient", "sdpa_default")


def test_reading_the_names_imports_no_torch():
    loaded = run_python("import flashwatt.vocabulary, flashwatt.models.cell, flashwatt.training.cell, "
                        "flashwatt.distributed.cell, flashwatt.control.configuration, flashwatt.kernels; "
                        "import sys; print(' '.join(sys.modules))").split()
    assert "torch" not in loaded and "flashwatt.kernels.registry" in loaded


def test_every_implementation_named_is_there():
    for declared in registry.backends():
        get_kernel(declared.name)
        if declared.block is not None and declared.block.implementation:
            assert load(declared.block.implementation)().name == declared.block.name
        for pick in declared.block.picks if declared.block else ():
            assert registry.backend_of_block(pick).block.implementation


def test_our_kernels_declaration_is_what_its_module_runs():
    from flashwatt.kernels import custom

    declared = registry.backend("custom")
    assert declared.head_dims == custom.HEAD_DIMS and set(declared.precisions) == set(custom.PRECISIONS)


def test_registering_after_the_names_were_taken_is_refused():
    from flashwatt import vocabulary  # noqa: F401 - takes the names
    from toy_backend import TOY

    with pytest.raises(RuntimeError, match="registered after the registry's names were derived"):
        registry.register(TOY)
    assert "toy" not in registry.kernel_names()


# ---- what a declaration rules out, before any tensor ------------------------------------
def call(**kw) -> AttentionCall:
    return AttentionCall(**{**dict(precision="fp32", seq_len=64, batch=2, heads=4, head_dim=64), **kw})


@pytest.mark.parametrize("name, asked, device, reason", [
    ("sdpa_flash", call(), CUDA, "sdpa_flash runs fp16/bf16 only (asked for fp32)"),
    ("sdpa_cudnn", call(precision="tf32"), CUDA, "sdpa_cudnn runs fp16/bf16 only (asked for tf32)"),
    ("sdpa_efficient", call(), CPU, "sdpa_efficient needs a CUDA device (running on cpu)"),
    ("naive", call(precision="bf16"), CPU, "naive on CPU runs fp32 only (asked for bf16)"),
    ("sdpa_math", call(variant="m128_n64_w4_s2"), CPU, "sdpa_math has no launch variants (asked for 'm128_n64_w4_s2')"),
    ("custom", call(precision="bf16", head_dim=96), CUDA, "custom takes head_dim 64, 128, 256 (asked for 96)"),
])
def test_the_declaration_says_why_not(name, asked, device, reason):
    assert get_kernel(name).supports(asked, device) == reason


def test_a_backend_declared_without_backward_or_mask_refuses_those_calls():
    declared = Backend("fwd_only", "flashwatt.kernels.naive:Naive", ("fp32",), ("fp32",), causal=False,
                       backward=False)
    kernel = declared.kernel()
    assert not kernel.differentiable
    assert kernel.supports(call(pass_="fwd_bwd"), CPU) == "fwd_only has no backward pass"
    assert kernel.supports(call(causal=True), CPU) == "fwd_only has no causal mask"
    assert kernel.supports(call(), CPU) is None


@pytest.mark.parametrize("name", registry.kernel_names())
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_a_cell_and_its_call_get_the_same_answer(name, precision):
    cell = Cell("t", name, precision, 64, 2, 4, 64, causal=True, pass_="fwd_bwd")
    described = call(precision=precision, causal=True, pass_="fwd_bwd")
    assert {f: getattr(cell, f) for f in AttentionCall.__dataclass_fields__ if f != "kv_heads"} == \
        {f: getattr(described, f) for f in AttentionCall.__dataclass_fields__ if f != "kv_heads"}
    assert get_kernel(name).supports(cell, CPU) == get_kernel(name).supports(described, CPU)


def test_the_implementations_own_answer_comes_after_the_declarations():
    class Picky:
        def supports(self, call, device):
            return "picky says no"

        def __call__(self, q, k, v, call):
            return q

    kernel = DeclaredKernel(registry.backend("naive"), Picky())
    assert kernel.supports(call(), CPU) == "picky says no"
    assert kernel.supports(call(precision="fp16"), CPU).startswith("naive on CPU runs fp32 only")


def test_the_controllers_candidates_follow_each_backends_declared_precisions():
    from flashwatt.control.configuration import candidates

    # tf32 inputs: the half-precision-only backends join only at a cheaper precision; only
    # our kernel takes launch variants
    assert [c.label for c in candidates("tf32", precision_opt_in=True)] == [
        "custom", "custom bf16", "custom fp16", "custom[ctas66]", "custom[ctas66] bf16", "custom[ctas66] fp16",
        "custom[ctas33]", "custom[ctas33] bf16", "custom[ctas33] fp16", "sdpa_cudnn bf16", "sdpa_cudnn fp16",
        "sdpa_flash bf16", "sdpa_flash fp16", "sdpa_efficient", "sdpa_efficient bf16", "sdpa_efficient fp16"]


# ---- distributed blocks ----------------------------------------------------------------
@pytest.mark.parametrize("precision, device, block", [
    ("bf16", "cuda", "flash"), ("fp16", "cuda", "flash"), ("fp32", "cuda", "efficient"), ("fp64", "cuda", "math"),
    ("fp32", "cpu", "math"), ("fp64", "cpu", "math"),
])
def test_auto_picks_the_first_block_that_takes_the_inputs(precision, device, block):
    assert registry.runnable_block("auto", precision, device).name == block


@pytest.mark.parametrize("block, dtype, reason", [
    ("flash", torch.float32, r"'flash' \(sdpa_flash\) needs a CUDA device \(running on cpu\)"),
    ("nope", torch.float32, "unknown block 'nope'; allowed: math, flash"),
])
def test_get_block_refuses_what_the_block_cannot_take(block, dtype, reason):
    from flashwatt.distributed.blocks import get_block

    with pytest.raises(ValueError, match=reason):
        get_block(block, torch.zeros(1, 1, 4, 8, dtype=dtype))


def test_block_refusals_name_precision_and_head_dim():
    assert registry.block_refusal("flash", "fp32", "cuda") == "block 'flash' (sdpa_flash) runs fp16/bf16 only " \
                                                               "(asked for fp32)"
    assert "takes head_dim 64, 128, 256 (asked for 32)" in registry.block_refusal("custom", "bf16", "cuda", 32)
    assert registry.block_refusal("auto", "fp8", "cuda") == ("block 'auto' (sdpa_default) finds none of flash, "
                                                             "efficient, math that runs fp8 on cuda")


def test_auto_on_the_cpu_computes_with_the_float64_block():
    from flashwatt.distributed.blocks import get_block
    from flashwatt.kernels.blocks import MathBlock

    assert type(get_block("auto", torch.zeros(1, 1, 4, 8, dtype=torch.float64))) is MathBlock


# ---- one registration, four uses --------------------------------------------------------
def test_a_backend_registered_once_is_seen_and_run_by_every_kind_of_cell():
    """tests/toy_backend.py: float64 reference attention declared fp32-only, without
    grouped-query attention, with a block that returns the LSE, among the controller's
    candidates; registered in a fresh process before anything derives the names."""
    seen = json.loads(run_python("import toy_backend; toy_backend.main()").splitlines()[-1])

    attention = seen["attention"]
    assert attention["names"][-1] == "toy" and attention["schema"] == attention["names"]
    assert attention["status"] == "ok" and attention["check"]["passed"], attention
    assert attention["check"]["grad_rel_err"] < 1e-6  # the backward ran through it

    model = seen["model"]
    assert model["names"][-1] == "toy" and model["adapter"][-1] == "toy"
    assert model["status"] == "ok" and model["check"], model
    assert model["kv_expanded"]  # llama_tiny's 2 K/V heads went expanded to its 4 query heads

    distributed = seen["distributed"]
    assert distributed["names"][-1] == distributed["block_names"][-1] == distributed["block_of"] == "toy"
    assert distributed["status"] == "ok" and distributed["check"] and distributed["block"] == "toy", distributed

    control = seen["control"]
    assert control["names"][-1] == "toy"
    assert "toy" in control["fp32"] and "toy" not in control["bf16"]  # declared fp32 only
    assert control["variant_refused"]

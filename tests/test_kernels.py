"""The registry contract on the CPU: supports() reasons, and the CPU kernels' output."""
import pytest
import torch

from flashwatt.attention.cell import Cell
from flashwatt.kernels import KERNEL_NAMES, get_kernel
from flashwatt.measure import make_inputs, reference_attention, relative_error

CPU = torch.device("cpu")


def cell(kernel, **kw):
    base = dict(suite="smoke", kernel=kernel, precision="fp32", seq_len=48, batch=2, heads=3, head_dim=16)
    return Cell(**{**base, **kw})


def test_every_registered_name_resolves():
    for name in KERNEL_NAMES:
        assert get_kernel(name).name == name
    with pytest.raises(KeyError, match="unknown kernel 'nope'; allowed: naive"):
        get_kernel("nope")


@pytest.mark.parametrize("name", ["sdpa_flash", "sdpa_efficient", "sdpa_cudnn", "custom"])
def test_gpu_backends_explain_why_not_on_cpu(name):
    reason = get_kernel(name).supports(cell(name, precision="fp16"), CPU)
    assert reason and ("CUDA" in reason or "cuda" in reason)


@pytest.mark.parametrize("name, precision", [("sdpa_flash", "fp32"), ("sdpa_cudnn", "fp32")])
def test_half_only_backends_refuse_fp32_even_on_gpu(name, precision):
    reason = get_kernel(name).supports(cell(name, precision=precision), torch.device("cuda", 0))
    assert reason and "fp16/bf16" in reason


@pytest.mark.parametrize("name", ["naive", "sdpa_math"])
@pytest.mark.parametrize("causal", [False, True])
def test_cpu_kernels_compute_attention(name, causal):
    c = cell(name, causal=causal)
    assert get_kernel(name).supports(c, CPU) is None
    q, k, v = make_inputs(c, CPU, seed=3, sets=1)[0]
    out = get_kernel(name)(q, k, v, c)
    assert out.shape == q.shape and out.dtype == q.dtype
    assert relative_error(out, reference_attention(q, k, v, causal)) < 1e-6


def test_causal_differs_from_full():
    c = cell("naive")
    q, k, v = make_inputs(c, CPU, seed=3, sets=1)[0]
    full = get_kernel("naive")(q, k, v, c)
    causal = get_kernel("naive")(q, k, v, cell("naive", causal=True))
    assert relative_error(causal, reference_attention(q, k, v, False)) > 1e-2
    assert torch.allclose(full[..., -1, :], causal[..., -1, :], atol=1e-6)  # last row sees every key


def test_kernel_details_are_recorded_and_their_failure_is_not_fatal():
    from flashwatt.attention.job import kernel_details

    class Described:
        def describe(self, cell):
            return {"build": {"build_key": "abc", "build_seconds": 28.7}, "launch": {"tile": "m128_n64_w4_s2"}}

    class Broken:
        def describe(self, cell):
            raise RuntimeError("no GPU")

    c = cell("custom")
    assert kernel_details(Described(), c)["build"]["build_seconds"] == 28.7
    assert kernel_details(Broken(), c) == {"kernel_details_error": "RuntimeError: no GPU"}
    assert kernel_details(get_kernel("naive"), c) == {}

"""What flashwatt's own kernels accept, and the device they run on.

The forward (flashwatt.kernels.custom_forward), the backward (custom_backward) and the
autograd operation over both (custom_autograd) share these checks, so each refuses the
same inputs with the same message, before any launch:

- `check_inputs`: q, k, v as (B, H, L, D) CUDA tensors of one dtype, a supported head dim,
  k/v heads dividing the query heads (grouped-query attention);
- `precision_of`: the precision those inputs run at (their dtype's, or tf32 asked for on
  float32 inputs);
- `kernel_ready`: a view the kernels can read with 16-byte loads, copied only if needed;
- `device_properties`, `capability`: the device's properties, looked up once per device.

torch is imported inside the functions, so that config validation can import the kernels'
names without it.
"""
from __future__ import annotations

import functools

HEAD_DIMS = (64, 128, 256)
# fp8: e4m3 operands on Hopper, from 16-bit inputs quantised in the call or pre-quantised
# float8_e4m3fn ones (flashwatt.kernels.custom_fp8).
PRECISIONS = ("fp16", "bf16", "fp32", "tf32", "fp8")


def precision_of(dtype, precision: str | None) -> str:
    """The cell precision these inputs run at: their dtype's, tf32 asked for on float32, or fp8
    asked for on 16-bit inputs (float8_e4m3fn inputs are fp8 already)."""
    import torch

    natural = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32",
               torch.float8_e4m3fn: "fp8"}.get(dtype, str(dtype))
    if precision is None or precision == natural:
        return natural
    if precision == "tf32" and dtype == torch.float32:
        return "tf32"
    if precision == "fp8" and dtype in (torch.float16, torch.bfloat16):
        return "fp8"
    raise ValueError(f"custom kernel: precision {precision!r} does not run {dtype} inputs (tf32 takes float32, "
                     f"fp8 float16, bfloat16 or float8_e4m3fn)")


def check_inputs(q, k, v) -> None:
    """ValueError (TypeError for a non-tensor) naming what the kernels cannot run."""
    import torch

    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"custom kernel: {name} must be a torch.Tensor")
        if t.device.type != "cuda":
            raise ValueError(f"custom kernel: {name} must be on a CUDA device (is on {t.device})")
        if t.dim() != 4:
            raise ValueError(f"custom kernel: {name} must be 4-d, got shape {tuple(t.shape)}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"custom kernel: q, k, v on different devices ({q.device}, {k.device}, {v.device})")
    if not (q.dtype == k.dtype == v.dtype):
        raise ValueError(f"custom kernel: q, k, v dtypes differ ({q.dtype}, {k.dtype}, {v.dtype})")
    if q.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise ValueError(f"custom kernel: dtype {q.dtype} not supported (float16, bfloat16, float32)")
    if capability(q.device) < (8, 0):
        raise ValueError("custom kernel: needs compute capability 8.0 or newer")
    B, H, L, D = q.shape
    if D not in HEAD_DIMS:
        raise ValueError(f"custom kernel: head_dim {D} not supported ({', '.join(map(str, HEAD_DIMS))})")
    if k.shape != v.shape:
        raise ValueError(f"custom kernel: k {tuple(k.shape)} and v {tuple(v.shape)} differ in shape")
    if k.shape[0] != B or k.shape[3] != D:
        raise ValueError(f"custom kernel: k/v {tuple(k.shape)} do not match q {tuple(q.shape)} in batch or head_dim")
    if k.shape[1] < 1 or H % k.shape[1]:
        raise ValueError(f"custom kernel: q heads ({H}) must be a multiple of k/v heads ({k.shape[1]})")
    if min(B, H, L, k.shape[2]) < 1:
        raise ValueError("custom kernel: empty input")


def kernel_ready(t):
    """A view the kernel can read with 16-byte loads; a copy in fresh memory only if it
    cannot (`contiguous()` would hand back a contiguous tensor that starts off alignment).
    Written out rather than looped: it runs on four tensors in every call's host path."""
    b, h, l, d = t.stride()
    elem = t.element_size()
    if d == 1 and t.data_ptr() % 16 == 0 and (b * elem) % 16 == 0 and (h * elem) % 16 == 0 and (l * elem) % 16 == 0:
        return t
    import torch

    return t.clone(memory_format=torch.contiguous_format)


@functools.lru_cache(maxsize=64)
def _properties_of(index: int):
    import torch

    return torch.cuda.get_device_properties(index)


def device_properties(device):
    """torch's properties of a CUDA device (index None: the current one), looked up once per
    device: the launch path reads its capability, SM count and L2 size on every call."""
    import torch

    device = torch.device(device)
    return _properties_of(device.index if device.index is not None else torch.cuda.current_device())


def capability(device) -> tuple[int, int]:
    """Compute capability of a CUDA device (index None: the current one)."""
    props = device_properties(device)
    return (props.major, props.minor)

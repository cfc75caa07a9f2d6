"""The backend registry: every attention implementation flashwatt runs, declared once.

Each `Backend` (flashwatt.kernels.declaration) names an implementation, what it supports and
where it lives. Every list of backend names derives from these declarations:

    flashwatt.vocabulary.KERNEL_NAMES             attention cells: every backend
    flashwatt.models.cell.MODEL_BACKENDS          model and training cells: transformers' own
                                                  two, then each backend `in_models`
    flashwatt.distributed.cell.BLOCKS             distributed cells: each backend's `block`
    flashwatt.control.configuration.CONTROL_BACKENDS  the controller's candidates: each backend
                                                  with a `control_order`

so a backend declared here appears in all four, as far as its declaration allows, and
the model adapter (flashwatt.models.attention), the distributed blocks
(flashwatt.distributed.blocks) and the controller call it through `get_kernel` and
`get_block`. Torch-free: config validation and the workflow read the names while they plan.

`register` adds a backend from elsewhere (a plugin, a test) before any of those lists is
derived; once one is, the names are fixed for the process and `register` refuses.
"""
from __future__ import annotations

import functools

from flashwatt.kernels.declaration import Backend, Block, DeclaredKernel

EVERY_PRECISION = ("fp32", "tf32", "fp16", "bf16")
HALF = ("fp16", "bf16")
# Measured on the CPU in fp32 only: tf32 exists only on CUDA tensor cores, and CPU
# half-precision matmuls measure an emulation path nobody deploys.
CPU_FP32 = ("fp32",)

_DECLARED: dict[str, Backend] = {b.name: b for b in (
    Backend("naive", "flashwatt.kernels.naive:Naive", EVERY_PRECISION, CPU_FP32,
            # in a model, transformers' own eager attention is this baseline (flashwatt.models.cell)
            in_models=False),
    Backend("sdpa_math", "flashwatt.kernels.sdpa:SDPA_MATH", EVERY_PRECISION, CPU_FP32,
            block=Block("math", "flashwatt.kernels.blocks:MathBlock", ("fp64", *EVERY_PRECISION),
                        ("fp64", *EVERY_PRECISION))),
    # Deterministic under torch's deterministic mode, which PyTorch passes on to its backward.
    Backend("sdpa_flash", "flashwatt.kernels.sdpa:SDPA_FLASH", HALF, control_order=2,
            block=Block("flash", "flashwatt.kernels.blocks:FlashBlock", HALF)),
    # Deterministic under torch's deterministic mode, which makes it split no key range.
    Backend("sdpa_efficient", "flashwatt.kernels.sdpa:SDPA_EFFICIENT", EVERY_PRECISION, control_order=3,
            block=Block("efficient", "flashwatt.kernels.blocks:EfficientBlock", EVERY_PRECISION)),
    # PyTorch does not pass its deterministic mode on to cuDNN's attention backward.
    Backend("sdpa_cudnn", "flashwatt.kernels.sdpa:SDPA_CUDNN", HALF, deterministic=False, control_order=1,
            block=Block("cudnn", "flashwatt.kernels.blocks:CudnnBlock", HALF)),
    # PyTorch's own choice, nothing forced (cuDNN's kernel for bf16 on an H100): what a
    # user gets from a plain call. Its block picks as PyTorch would, by the inputs.
    Backend("sdpa_default", "flashwatt.kernels.sdpa:SDPA_DEFAULT", EVERY_PRECISION, CPU_FP32, deterministic=False,
            control_order=4, block=Block("auto", picks=("flash", "efficient", "math"))),
    # Its backward adds dQ from a pass of its own under torch's deterministic mode. fp8: the
    # e4m3 forward on Hopper (flashwatt.kernels.custom_fp8), the only backend that runs it.
    Backend("custom", "flashwatt.kernels.custom:Custom", (*EVERY_PRECISION, "fp8"), head_dims=(64, 128, 256),
            variants=True,
            control_order=0,
            block=Block("custom", "flashwatt.kernels.blocks:CustomBlock", EVERY_PRECISION)),
)}
# Set when a list of names is first derived: after that a registration would be missing
# from the lists already taken.
_names_taken = False


def register(backend: Backend) -> Backend:
    """Add a backend to the registry; before any list of names is derived (see above)."""
    if _names_taken:
        raise RuntimeError(f"backend {backend.name!r} registered after the registry's names were derived "
                           "(flashwatt.vocabulary and the cell modules take them when imported): register it first")
    if backend.name in _DECLARED:
        raise ValueError(f"backend {backend.name!r} is declared already")
    if backend.block is not None and backend.block.name in _blocks():
        raise ValueError(f"block {backend.block.name!r} ({backend.name}) is declared already")
    _DECLARED[backend.name] = backend
    return backend


def backends() -> tuple[Backend, ...]:
    """Every backend, in the order declared; the names it yields are final from now on."""
    global _names_taken
    _names_taken = True
    return tuple(_DECLARED.values())


def backend(name: str) -> Backend:
    if name not in _DECLARED:
        raise KeyError(f"unknown kernel {name!r}; allowed: {', '.join(_DECLARED)}")
    return _DECLARED[name]


# ---- the names each use derives -------------------------------------------------------
def kernel_names() -> tuple[str, ...]:
    """Attention cells: every backend."""
    return tuple(b.name for b in backends())


def model_backend_names() -> tuple[str, ...]:
    """The backends that plug into a model's attention layers."""
    return tuple(b.name for b in backends() if b.in_models)


def block_names() -> tuple[str, ...]:
    """Distributed cells: the block of each backend that has one."""
    return tuple(b.block.name for b in backends() if b.block is not None)


def control_backend_names() -> tuple[str, ...]:
    """The controller's candidates, in the order it tries them."""
    ordered = sorted((b for b in backends() if b.control_order is not None), key=lambda b: b.control_order)
    return tuple(b.name for b in ordered)


# ---- calling a backend ----------------------------------------------------------------
@functools.lru_cache(maxsize=None)
def get_kernel(name: str) -> DeclaredKernel:
    """The backend's kernel behind its declaration (flashwatt.kernels.base.Kernel); imports
    its implementation on first use."""
    return backend(name).kernel()


def _blocks() -> dict[str, Backend]:
    return {b.block.name: b for b in _DECLARED.values() if b.block is not None}


def backend_of_block(block: str) -> Backend:
    """The backend whose distributed block this is; ValueError naming the blocks if none."""
    owners = _blocks()
    if block not in owners:
        raise ValueError(f"unknown block {block!r}; allowed: {', '.join(owners)}")
    return owners[block]


def block_of(backend_name: str) -> str | None:
    """The distributed block of a backend (None: it has none, or is no registry backend)."""
    found = _DECLARED.get(backend_name)
    return found.block.name if found is not None and found.block is not None else None


def runnable_block(block: str, precision: str, device_type: str, head_dim: int | None = None) -> Block:
    """The block that computes for `block` with inputs of this precision (fp64 for float64)
    and head dim on this device type: the block itself, or the first of those it picks
    that takes them; ValueError saying why when there is none."""
    owner = backend_of_block(block)
    if not owner.block.picks:
        reason = owner.block_refusal(precision, device_type, head_dim)
        if reason is not None:
            raise ValueError(reason)
        return owner.block
    for pick in owner.block.picks:
        if backend_of_block(pick).block_refusal(precision, device_type, head_dim) is None:
            return backend_of_block(pick).block
    at = f" at head_dim {head_dim}" if head_dim is not None else ""
    raise ValueError(f"block {block!r} ({owner.name}) finds none of {', '.join(owner.block.picks)} that runs "
                     f"{precision}{at} on {device_type}")


def block_refusal(block: str, precision: str, device_type: str, head_dim: int | None = None) -> str | None:
    """Why `block` cannot compute inputs of this precision and head dim here, or None."""
    try:
        runnable_block(block, precision, device_type, head_dim)
    except ValueError as err:
        return str(err)
    return None

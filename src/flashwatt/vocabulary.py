"""The names a cell is made of, and the tolerances its check uses: declared once, here
(the kernel names once in the backend registry, flashwatt.kernels.registry).

Torch-free, so that config validation, the DAG and the schema read them without
importing any backend. `cell` validates against these names, `measure` takes the
tolerances, and `config` fills the schema's enums from this module, so the YAML schema
does not repeat the lists.
"""
from __future__ import annotations

from flashwatt.kernels.registry import kernel_names

# Every attention backend of the registry, in the order declared.
KERNEL_NAMES = kernel_names()
# Storage and arithmetic of a cell: fp32 is real fp32 (tf32 switched off), tf32 opts in; fp8
# takes bf16 inputs and quantises them to e4m3 in the call (flashwatt.kernels.custom_fp8).
PRECISIONS = ("fp32", "tf32", "fp16", "bf16", "fp8")
PASSES = ("fwd", "fwd_bwd")
HEAD_DIMS = (16, 32, 64, 128, 256)

# Relative-error bounds against float64, forward output and gradients. fp32 is real
# fp32 arithmetic; tf32 keeps 10 mantissa bits; the half types are bounded by their
# 8/11-bit mantissas accumulated over L terms. fp8 (e4m3, 3 mantissa bits: unit roundoff
# 2^-4, 2.6 % RMS per element at a per-head scale) rounds Q, K, V and P: about 5 % on N(0, 1)
# inputs (flashwatt.kernels.fp8_numerics emulates it), bounded at twice that; it has no
# backward, so no gradient bound.
TOLERANCE = {
    "fp32": {"fwd": 1e-5, "grad": 5e-5},
    "tf32": {"fwd": 2e-3, "grad": 5e-3},
    "fp16": {"fwd": 5e-3, "grad": 1e-2},
    "bf16": {"fwd": 1e-2, "grad": 2e-2},
    "fp8": {"fwd": 1e-1, "grad": None},
}
# A precision whose inputs are stored in another one: an fp8 cell's inputs are bf16, and its
# check records the bf16 run's error on the same inputs beside its own.
STORED_AS = {"fp8": "bf16"}

# Where in the config schema each list goes (path of keys to the grid's properties).
SCHEMA_ENUMS = {"kernels": KERNEL_NAMES, "precisions": PRECISIONS, "passes": PASSES, "head_dims": HEAD_DIMS}

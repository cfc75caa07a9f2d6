"""A backend declared from outside flashwatt (tests/test_backend_registry.py registers it):
attention computed by the float64 reference, and float64 math blocks under its own name.

It declares fp32 only, no grouped-query attention (so callers must expand K/V for it),
a block that returns the LSE, and a place among the controller's candidates.
"""
from __future__ import annotations

from flashwatt.kernels import Backend, Block
from flashwatt.kernels.blocks import MathBlock

ORDER = 10  # after every built-in backend the controller may choose


class Float64Reference:
    """softmax(q kᵀ/√d) v in float64 (flashwatt.measure.reference_attention), in q's dtype."""

    def __call__(self, q, k, v, call):
        from flashwatt.measure import reference_attention

        assert k.shape[1] == q.shape[1], "declared without grouped-query attention: K/V must come expanded"
        return reference_attention(q, k, v, call.causal).to(q.dtype)


class ToyBlock(MathBlock):
    name = "toy"


TOY = Backend("toy", "toy_backend:Float64Reference", ("fp32",), ("fp32",), grouped_query=False, control_order=ORDER,
              block=Block("toy", "toy_backend:ToyBlock", ("fp64", "fp32"), ("fp64", "fp32")))


def main() -> None:
    """Register the toy backend, then use it as each kind of cell would, on the CPU; print
    what was seen as JSON (run in a fresh process: registration comes before the names are
    derived, as a declaration in flashwatt.kernels.registry would)."""
    import json

    from flashwatt.kernels import registry

    registry.register(TOY)
    print(json.dumps({"attention": _attention(), "model": _model(), "distributed": _distributed(),
                      "control": _control()}))


def _attention() -> dict:
    from flashwatt.attention.cell import Cell
    from flashwatt.attention.job import run_cell
    from flashwatt.config import load_schema
    from flashwatt.vocabulary import KERNEL_NAMES

    grid = load_schema()["properties"]["suites"]["additionalProperties"]["properties"]["grids"]["items"]["properties"]
    cell = Cell("t", "toy", "fp32", 64, 2, 2, 16, causal=True, pass_="fwd_bwd")
    record = run_cell(cell, {"energy": False, "warmup_ms": 1, "min_time_ms": 1, "min_repeats": 2,
                             "cuda_graph": False}).record
    return {"names": list(KERNEL_NAMES), "schema": grid["kernels"]["items"]["enum"], "status": record["status"],
            "reason": record.get("reason"), "check": record.get("check")}


def _model() -> dict:
    from flashwatt.models import attention
    from flashwatt.models.cell import MODEL_BACKENDS, ModelCell
    from flashwatt.models.job import run_model_cell
    from flashwatt.models.presets import model_spec
    from flashwatt.training.cell import TrainCell

    TrainCell("t", "llama_tiny", "toy", "fp32", "adamw", "cosine", 1e-3, 0.0, 0.1, 2, 32, 64, 0)
    cell = ModelCell("t", "llama_tiny", "toy", "fp32", "train", 32, 1)
    record = run_model_cell(cell, {"model": model_spec("llama_tiny"), "seed": 0, "measure": {"energy": False},
                                   "steps": {"warmup_steps": 1, "timed_steps": 1, "attention_steps": 0}}).record
    return {"names": list(MODEL_BACKENDS), "adapter": list(attention.REGISTRY), "status": record["status"],
            "reason": record.get("reason"), "check": record.get("check", {}).get("passed"),
            "kv_expanded": record.get("attention", {}).get("kv_expanded")}


def _distributed() -> dict:
    from flashwatt.distributed.blocks import BLOCK_NAMES
    from flashwatt.distributed.cell import BLOCKS, DistributedCell
    from flashwatt.distributed.job import job
    from flashwatt.models.cp_attention import block_of
    from support import free_ports

    cell = DistributedCell("t", "ring", "toy", "fp64", 1, 16, 1, 4, 2, 8, causal=True, pass_="fwd_bwd")
    record = job(cell.spec(repeats=1, warmup=0, measure={"energy": False}), rank=0, world=1, local_rank=0,
                 addr="127.0.0.1", port=free_ports()[0])
    return {"names": list(BLOCKS), "block_names": list(BLOCK_NAMES), "block_of": block_of("toy"),
            "status": record["status"], "reason": record.get("reason"), "block": record.get("block"),
            "check": record.get("check", {}).get("passed")}


def _control() -> dict:
    from flashwatt.control.configuration import CONTROL_BACKENDS, ControlError, Configuration, candidates

    try:
        Configuration("toy", variant="ctas66")
        variant_refused = False
    except ControlError:
        variant_refused = True
    return {"names": list(CONTROL_BACKENDS), "fp32": [c.label for c in candidates("fp32")],
            "bf16": [c.label for c in candidates("bf16")], "variant_refused": variant_refused}

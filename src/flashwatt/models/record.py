"""The record a model cell's job starts from, on one GPU or several."""
from __future__ import annotations

from flashwatt.models.cell import ModelCell
from flashwatt.provenance import utc_now

SCHEMA_VERSION = 1


def base_record(cell: ModelCell, spec: dict) -> dict:
    return {"schema_version": SCHEMA_VERSION, "kind": "model", "cell": cell.as_row(), "status": None, "reason": None,
            "spec": dict(spec), "started": utc_now()}

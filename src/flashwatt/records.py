"""Cell records on disk: JSON written atomically, read back with a clear error per file."""
from __future__ import annotations

import json
import math
import os
import tempfile
from pathlib import Path

import pandas as pd

# The version of the records this flashwatt writes. 2: every record names its kind
# (attention records of version 1 did not; they are still read).
SCHEMA_VERSION = 2


def _clean(value):
    """Strict JSON: NaN and infinities become null (the record's flags say what they meant)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def atomic_write(path: str | Path, write) -> None:
    """Write through a temporary file in the same folder, then rename: never half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write(tmp)
        # mkstemp creates 0600; results are shared like any file the user writes
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_record(path: str | Path, record: dict) -> None:
    text = json.dumps(_clean(record), indent=1, sort_keys=False, allow_nan=False, default=str)
    atomic_write(path, lambda tmp: Path(tmp).write_text(text + "\n"))


def write_trace(path: str | Path, rows: list[dict]) -> None:
    """The telemetry trace of a cell as Parquet; an empty table (with a gpu column) when none."""
    frame = pd.DataFrame(rows) if rows else pd.DataFrame({"gpu": pd.Series([], dtype="int64")})
    atomic_write(path, lambda tmp: frame.to_parquet(tmp, index=False))


def read_record(path: str | Path) -> dict:
    """A cell record as the current schema has it. Version 1 records are read as they are,
    with the `kind` that only attention records lacked; a record of a newer schema is
    refused, naming the file and what to do."""
    try:
        record = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise ValueError(f"cannot read cell record {path}: {err}") from err
    version = record.get("schema_version", 1) if isinstance(record, dict) else None
    if not isinstance(version, int) or version > SCHEMA_VERSION:
        raise ValueError(f"cell record {path} has schema version {version!r}; this flashwatt reads versions up to "
                         f"{SCHEMA_VERSION}: update flashwatt, or measure the cell again (snakemake -f {path})")
    if version == 1:
        record.setdefault("kind", "attention")  # version 2 added `kind`; every other kind had it already
    return record

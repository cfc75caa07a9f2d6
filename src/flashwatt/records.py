"""Cell records on disk: JSON written atomically, read back with a clear error per file."""
from __future__ import annotations

import json
import math
import os
import tempfile
from pathlib import Path

import pandas as pd


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
    try:
        return json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise ValueError(f"cannot read cell record {path}: {err}") from err

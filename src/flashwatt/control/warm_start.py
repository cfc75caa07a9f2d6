"""What the controller learned, kept between runs: a warm start for the next one.

A run that finished exploring a shape knows each configuration's GPU time, its tokens/s per
watt at the set point, its joules per token and its duty -> power table. The next run on
the same GPU with the same software starts from that knowledge at its operating point
instead of exploring again (it still re-checks the runner-up now and then, so knowledge
that went stale is corrected; flashwatt.control.governor). A run that ended while still
exploring saves what its probe and the candidates it explored measured, marked partial: the
next run explores on from there instead of from nothing.

Where: `$FLASHWATT_CONTROL_CACHE`, else `results/control-cache` under the current directory
(the repository root when the workflow runs), as the kernel build cache does. `off` (or an
empty value) switches warm starts off. Layout:

    <root>/<gpu uuid, or its name>/<key digest>.json   one file per GPU and software key
    <root>/<gpu uuid, or its name>/<key digest>.lock   its lock
    <root>/<rank 0's gpu uuid>-job<N>/<key digest>.json   a job on N GPUs (its rank 0 decides)

The key is the GPU's model and UUID, the driver, and the build: our kernel's build key
(its sources, arch, torch, CUDA, compiler flags: flashwatt.build.build_key), torch, CUDA
and cuDNN versions. Inside a file, entries are keyed by the call's shape, which names its
precision. A new driver or build gives a new digest: the old file is never read again, and
the first save under the new key removes the files of the old keys of that GPU
(invalidation).

Concurrent jobs on one node: a save takes the file's lock (an OS lock, released if the
process dies), reads the file again, merges its shapes into it and writes it through a
temporary file and a rename, so a reader never sees half a file and two jobs saving
different shapes keep both.

Clearing: `flashwatt control-cache --clear`, or remove the folder.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import time
from dataclasses import asdict, fields
from pathlib import Path

from flashwatt.control.model import PowerTable, Stats

CACHE_VARIABLE = "FLASHWATT_CONTROL_CACHE"
DEFAULT_ROOT = "results/control-cache"
FORMAT_VERSION = 1
_LOCK_TIMEOUT_S = 60.0
_STATS_FIELDS = tuple(f.name for f in fields(Stats))


def cache_root() -> Path | None:
    """The cache folder, or None where warm starts are switched off."""
    value = os.environ.get(CACHE_VARIABLE)
    if value is not None and value.strip().lower() in ("", "off", "none", "0", "false"):
        return None
    return Path(value or DEFAULT_ROOT).resolve()


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip("_") or "gpu"


def key_digest(key: dict) -> str:
    return hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:16]


def shape_text(shape: tuple) -> str:
    return str(shape)


def stats_to_dict(stats: Stats) -> dict:
    return asdict(stats)


def stats_from_dict(data: dict) -> Stats:
    return Stats(**{k: v for k, v in data.items() if k in _STATS_FIELDS})


def table_to_dict(table: PowerTable) -> dict:
    return {str(b): w for b, w in sorted(table.bins.items())}


def table_from_dict(data: dict) -> PowerTable:
    return PowerTable({int(b): float(w) for b, w in data.items()})


class WarmStartCache:
    """The cache of one GPU and software key (module docstring)."""

    def __init__(self, root: str | Path, key: dict):
        if not key.get("uuid") and not key.get("gpu"):
            raise ValueError("a warm-start key names the GPU (uuid or model)")
        self.key = dict(key)
        # (a job's tables, of its GPUs' summed power, in a folder of their own: a save removes
        # the files of the folder's other keys, and the one GPU's file is not the job's)
        job = f"-job{key['job_ranks']}" if key.get("job_ranks") else ""
        self.folder = Path(root) / (_slug(str(key.get("uuid") or key.get("gpu"))) + job)
        self.digest = key_digest(self.key)
        self.path = self.folder / f"{self.digest}.json"
        self._shapes = self._read().get("shapes", {})

    def _read(self) -> dict:
        try:
            data = json.loads(self.path.read_text())
        except FileNotFoundError:
            return {}
        except (OSError, json.JSONDecodeError):
            return {}  # unreadable: treated as empty, and rewritten by the next save
        if data.get("format") != FORMAT_VERSION or data.get("key") != json.loads(json.dumps(self.key, default=str)):
            return {}
        return data

    def lookup(self, shape: tuple) -> dict | None:
        """What was learned for a shape: {"stats": {label: Stats}, "power": {label: PowerTable},
        "refused": {label: reason}, "mixed": whether it ran mixed with other shapes (then
        "power" holds the mix's table too), "partial": whether every run that saved it ended
        while still exploring it, "runs": how many runs saved it}."""
        entry = self._shapes.get(shape_text(shape))
        if not entry or not entry.get("stats"):
            return None
        return {"stats": {label: stats_from_dict(s) for label, s in entry["stats"].items()},
                "power": {label: table_from_dict(t) for label, t in entry.get("power", {}).items()},
                "refused": dict(entry.get("refused", {})), "mixed": bool(entry.get("mixed", False)),
                "partial": bool(entry.get("partial", False)), "runs": entry.get("runs", 0)}

    def shapes(self) -> list[str]:
        return sorted(self._shapes)

    def save(self, learned: dict[tuple, dict]) -> None:
        """Merge what a run learned ({shape: {"stats": {label: Stats}, "power": {label:
        PowerTable}, "refused": {label: reason}, "partial": bool}}) into the file, under its lock;
        configurations this run did not measure keep what the file had."""
        if not learned:
            return
        from filelock import FileLock

        from flashwatt.records import atomic_write

        self.folder.mkdir(parents=True, exist_ok=True)
        with FileLock(str(self.folder / f"{self.digest}.lock"), timeout=_LOCK_TIMEOUT_S):
            data = self._read() or {"format": FORMAT_VERSION, "key": self.key, "shapes": {}}
            for shape, what in learned.items():
                partial = bool(what.get("partial", False))
                entry = data["shapes"].setdefault(shape_text(shape), {"stats": {}, "power": {}, "runs": 0,
                                                                      "partial": partial})
                # (an entry stays whole once a run finished exploring it)
                entry["partial"] = bool(entry.get("partial", False)) and partial
                # A run that ended exploring may have only probed a configuration another run
                # measured at its operating point: it keeps what has more power samples.
                taken = {label for label, st in what["stats"].items()
                         if not (partial and entry["stats"].get(label, {}).get("eta_samples", 0) > st.eta_samples)}
                entry["stats"].update({label: stats_to_dict(st) for label, st in what["stats"].items() if label in taken})
                entry["power"].update({label: table_to_dict(t) for label, t in what.get("power", {}).items()
                                       if label in taken or label not in what["stats"]})
                entry.setdefault("refused", {}).update(what.get("refused", {}))
                entry["mixed"] = bool(what.get("mixed", False))
                entry["runs"] = entry.get("runs", 0) + 1
                entry["updated"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
            data["updated"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
            text = json.dumps(data, indent=1, default=str)
            atomic_write(self.path, lambda tmp: Path(tmp).write_text(text + "\n"))
            self._shapes = data["shapes"]
            # Files of this GPU under another key (an older driver or build) are invalid. Their
            # locks stay: another process may hold one, and a lock file is empty.
            for stale in self.folder.glob("*.json"):
                if stale.name != self.path.name:
                    stale.unlink(missing_ok=True)


def list_entries(root: str | Path) -> list[dict]:
    """One row per cache file: its GPU folder, key, shapes and when it was updated."""
    rows = []
    for path in sorted(Path(root).glob("*/*.json")):
        try:
            data = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as err:
            rows.append({"path": str(path), "error": str(err)})
            continue
        rows.append({"path": str(path), "key": data.get("key"), "shapes": sorted(data.get("shapes", {})),
                     "updated": data.get("updated")})
    return rows


def clear(root: str | Path) -> int:
    """Remove every cache file (and lock) under `root`; the number of files removed."""
    removed = 0
    for path in sorted(Path(root).glob("*/*")):
        if path.suffix in (".json", ".lock") or path.name.startswith(".") and path.name.endswith(".tmp"):
            path.unlink(missing_ok=True)
            removed += path.suffix == ".json"
    for folder in Path(root).glob("*"):
        if folder.is_dir() and not any(folder.iterdir()):
            folder.rmdir()
    return removed

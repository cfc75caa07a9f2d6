"""Where a training run keeps its state between the jobs that run it.

    <cache>/checkpoints/<cell id>/state.pt       model, optimizer, schedule, scaler, RNGs, the run so far
    <cache>/checkpoints/<cell id>/progress.json  the latest evaluation reached (written at each one)

A Slurm job preempted or at its time limit is requeued by submitit (flashwatt.submit.jobs)
and runs the cell's function again from the start; the run then loads `state.pt` and
goes on from the evaluation it was saved at, reading the same batches (they are a
function of (seed, step)) with the same random state, so the curve continues as if
unbroken. `progress.json` tells the resumed run how far the lost job had got, so the
steps, seconds and joules thrown away are recorded rather than silently dropped.

Each file is written to a temporary name and renamed into place: a job killed while
saving leaves the previous state whole. A state is only resumed by the run that wrote
it: it holds a fingerprint of the cell and its spec, and a state from another spec (the
suite's evaluation or data changed since) is set aside, not loaded. A finished run
removes its directory, so asking for its record again trains it again from the start.
"""
from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

from flashwatt.records import atomic_write


def run_fingerprint(cell_id: str, spec: dict) -> str:
    text = json.dumps({"cell": cell_id, "spec": spec}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


class Checkpoints:
    def __init__(self, cache_dir: str | Path, cell_id: str, fingerprint: str):
        self.directory = Path(cache_dir) / "checkpoints" / cell_id
        self.fingerprint = fingerprint

    @property
    def state_path(self) -> Path:
        return self.directory / "state.pt"

    @property
    def progress_path(self) -> Path:
        return self.directory / "progress.json"

    def save(self, state: dict) -> None:
        import torch

        self.directory.mkdir(parents=True, exist_ok=True)
        payload = {"fingerprint": self.fingerprint, **state}
        atomic_write(self.state_path, lambda tmp: torch.save(payload, tmp))

    def load(self, map_location) -> tuple[dict | None, str | None]:
        """(state, None) to resume; (None, why not) when there is nothing to resume."""
        import torch

        if not self.state_path.is_file():
            return None, None
        try:
            state = torch.load(self.state_path, map_location=map_location, weights_only=False)
        except Exception as err:  # a state torch cannot read: start over, and say so
            return None, f"checkpoint {self.state_path} unreadable ({type(err).__name__}: {err}); started over"
        if state.get("fingerprint") != self.fingerprint:
            return None, f"checkpoint {self.state_path} is of another spec of this cell; started over"
        return state, None

    def note_progress(self, row: dict) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        text = json.dumps({"fingerprint": self.fingerprint, **row}, default=float)
        atomic_write(self.progress_path, lambda tmp: Path(tmp).write_text(text + "\n"))

    def progress(self) -> dict | None:
        try:
            progress = json.loads(self.progress_path.read_text())
        except (OSError, ValueError):
            return None
        return progress if progress.get("fingerprint") == self.fingerprint else None

    def clear(self) -> None:
        shutil.rmtree(self.directory, ignore_errors=True)

"""The measurement settings a cell runs with: one frozen, typed object from the config.

The config's `measure` block (with the suite's overrides) is validated by the schema;
this dataclass is what the job hands to timing, the float64 check and the energy window,
so a misspelt key fails here, naming it, instead of deep inside a measurement.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Mapping


@dataclass(frozen=True)
class MeasureSettings:
    seed: int = 0
    warmup_ms: float = 200
    # Timed steps (one step = one CUDA-graph replay of k calls, flashwatt.timing) at least,
    # and at least min_time_ms of device time, at most max_repeats steps.
    min_repeats: int = 30
    min_time_ms: float = 500
    max_repeats: int = 2000
    cuda_graph: bool = True
    rotate_inputs: bool = True
    check_max_rows: int = 2048
    energy: bool = True
    energy_window_s: float = 3.0
    idle_settle_s: float = 1.0
    idle_window_s: float = 1.0
    sampler_period_s: float = 0.1
    cooldown_s: float = 0
    cooldown_max_temp_c: float | None = None

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any] | "MeasureSettings") -> "MeasureSettings":
        if isinstance(values, cls):
            return values
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"measure settings: unknown key(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
        return cls(**values)

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def energy_window(self, *, idle: bool = True) -> dict[str, float]:
        """flashwatt.energy.measure_energy's window options from these settings. Without
        `idle`, no idle window is read before it (a comparison of two windows, whose ratio
        needs no idle baseline)."""
        return {"min_window_s": self.energy_window_s, "idle_settle_s": self.idle_settle_s if idle else 0.0,
                "idle_window_s": self.idle_window_s if idle else 0.0, "sampler_period_s": self.sampler_period_s}


def measure_settings(config: dict, suite: str) -> dict[str, Any]:
    """The measurement settings a suite's cells run with (recorded in every cell record):
    the config's `measure` block with the suite's own over it.

    Plain data, because Snakemake compares a rule's params between runs; the job turns
    it into `MeasureSettings`, which refuses unknown keys.
    """
    merged = {**config["measure"], **config["suites"][suite].get("measure", {})}
    return MeasureSettings.from_mapping(merged).as_dict()

"""The controller's eyes: a thread that reads the controlled GPU about ten times a second.

NVML's instant power (field 186) settles within one update (about 0.1 s) after a step in
load, where the averaged reading needs about 0.9 s (docs/measurement.md), so the loop reads
the instant field through `flashwatt.telemetry` (still the only importer of pynvml) and
acts at that rate. Each tick hands a `Reading` to a callback; a reading NVML could not give
(an exception, or no power value) arrives with `power_w` None and the error, so the
governor can tell a silent sensor from a quiet GPU.
"""
from __future__ import annotations

import threading
import time
from typing import Callable

from flashwatt.control.governor import Reading
from flashwatt.telemetry import Telemetry

DEFAULT_PERIOD_S = 0.1


def read(telemetry: Telemetry, clock: Callable[[], float] = time.monotonic) -> Reading:
    """One reading of the first GPU of `telemetry`; never raises."""
    t = clock()
    try:
        rows = telemetry.sample()
    except Exception as err:  # noqa: BLE001 - a sensor failure is data for the governor
        return Reading(t, None, error=f"{type(err).__name__}: {err}")
    if not rows:
        return Reading(t, None, error=telemetry.reason or "no GPU reading")
    row = rows[0]
    power = row.get("power_instant_w")
    return Reading(
        t=t,
        power_w=power,
        energy_mj=row.get("energy_mj"),
        temp_c=row.get("gpu_temp_c"),
        sm_clock_mhz=row.get("sm_clock_mhz"),
        clock_reasons=row.get("clock_reasons"),
        error=None if power is not None else "NVML returned no power value",
        gpu_util_pct=row.get("gpu_util_pct"),
    )


def idle_power(telemetry: Telemetry, seconds: float = 0.5, period_s: float = DEFAULT_PERIOD_S) -> float | None:
    """Median instant power over `seconds` before any work: this GPU's power without us
    (with whatever else shares it), the floor a budget must clear."""
    values = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        reading = read(telemetry)
        if reading.power_w is not None:
            values.append(reading.power_w)
        time.sleep(period_s)
    if not values:
        return None
    values.sort()
    return values[len(values) // 2]


class SensorThread:
    """Calls `on_tick(reading)` every `period_s` until stopped (a daemon thread)."""

    def __init__(self, telemetry: Telemetry, on_tick: Callable[[Reading], None], period_s: float = DEFAULT_PERIOD_S):
        self.telemetry = telemetry
        self.on_tick = on_tick
        self.period_s = period_s
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="flashwatt-control", daemon=True)

    def start(self) -> "SensorThread":
        self._thread.start()
        return self

    def _run(self) -> None:
        next_t = time.monotonic()
        try:
            while not self._stop.is_set():
                self.on_tick(read(self.telemetry))
                next_t += self.period_s
                delay = next_t - time.monotonic()
                if delay < 0:  # a slow tick: start again from now rather than burst
                    next_t, delay = time.monotonic(), 0.0
                self._stop.wait(delay)
        except BaseException as err:  # noqa: BLE001 - surfaced by the controller
            self.error = err

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5.0)

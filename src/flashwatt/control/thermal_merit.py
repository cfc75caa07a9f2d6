"""Figures of merit of a temperature limit, from a run's trace (one row per tick, with the
GPU's temperature in `temp_c` and the limit in `temp_limit_c`).

The limit is judged as the power budget is: by 1 s windows, here of the mean temperature
NVML read in the window, within the limit plus TEMP_TOLERANCE_C (1 degC: NVML reads whole
degrees). A run that starts over the limit (a hot board) cannot be under it until the board
has cooled, however little it draws: the windows before the first one within are counted
apart (`temp_cooling_windows`, and `temp_cooled_s` when that came), and the share within is
taken over the windows from then on.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from flashwatt.control.thermal_holding import TEMP_TOLERANCE_C


def temperature_windows(trace: pd.DataFrame, window_s: float = 1.0) -> pd.DataFrame:
    """Mean temperature and the limit of each consecutive window of `window_s` (NaN where the
    window holds no reading)."""
    t = trace["t"].to_numpy(dtype=float)
    temp = pd.to_numeric(trace.get("temp_c"), errors="coerce").to_numpy(dtype=float)
    limit = pd.to_numeric(trace.get("temp_limit_c"), errors="coerce").to_numpy(dtype=float)
    if len(t) < 2:
        return pd.DataFrame(columns=["start", "temp_c", "limit_c"])
    rows = []
    for start in np.arange(t[0], t[-1] - window_s + 1e-9, window_s):
        inside = (t >= start) & (t < start + window_s)
        known = inside & np.isfinite(temp)
        limits = limit[inside & np.isfinite(limit)]
        rows.append((start, float(temp[known].mean()) if known.any() else np.nan,
                     float(limits.min()) if len(limits) else np.nan))
    return pd.DataFrame(rows, columns=["start", "temp_c", "limit_c"])


def temperature_merit(trace: pd.DataFrame) -> dict:
    """The temperature limit's figures (empty where the run held none): windows judged, the
    share within limit + 1 degC after the board first got there, the cooling windows before
    that, the hottest window and the first temperature read."""
    if "temp_limit_c" not in trace or not pd.to_numeric(trace["temp_limit_c"], errors="coerce").notna().any():
        return {}
    windows = temperature_windows(trace).dropna()
    if windows.empty:
        return {"temp_windows": 0, "temp_windows_within_pct": None}
    within = (windows["temp_c"] <= windows["limit_c"] + TEMP_TOLERANCE_C).to_numpy()
    first = int(np.argmax(within)) if within.any() else len(within)
    judged = within[first:]
    readings = pd.to_numeric(trace["temp_c"], errors="coerce").dropna()
    return {
        "temp_limit_c": float(windows["limit_c"].iloc[0]),
        "temp_windows": int(len(judged)),
        "temp_windows_within_pct": float(100 * judged.mean()) if len(judged) else None,
        "temp_cooling_windows": first,
        "temp_cooled_s": float(windows["start"].iloc[first] - trace["t"].iloc[0]) if first < len(within) else None,
        "temp_worst_window_c": float(windows["temp_c"].iloc[first:].max()) if len(judged) else None,
        "temp_start_c": float(readings.iloc[0]) if len(readings) else None,
    }

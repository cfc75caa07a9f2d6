"""Why something is not drawn, in sentences taken from the tables.

A figure with no data shows one of these sentences instead (flashwatt.figure_base draws
the page), a panel whose quantity was not measured says why in its place, and a bar that
is missing is marked with its cell's outcome. Each is built from what the cells recorded
(their status, reason and energy reason), so a run on a machine without a GPU reads "no
CUDA device" rather than a guess, and the counts it gives are counts of the cells it talks
about. A quantity is named as a reader says it ("an energy measurement"), never by its
column ("j_per_token").
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import pandas as pd

# Reasons listed at most, most frequent first; the rest are counted as "other reasons".
MAX_REASONS = 3
# A reason longer than this is cut (tracebacks' first lines can run to hundreds of characters).
MAX_REASON_CHARS = 90
# A missing bar's mark runs along the bar's length, in small type, its outcome on one line
# and its reason on the next: the reason is cut shorter still.
MAX_MARK_CHARS = 56
# The mark of a bar whose cell the suite has no record of (its grids leave it out), told
# apart from a cell that ran and was skipped, failed or not measured.
NOT_IN_GRID = "not in grid"
# Why a cell has no energy when its table keeps no energy reason of its own (the model and
# training tables): NVML, which the energy is read from, exists on NVIDIA GPUs only.
CPU_ENERGY_REASON = "ran on a CPU: energy is measured on NVIDIA GPUs only"

# Where the reasons for a missing value come from: a column of the table, or a function of its rows.
Reasons = str | Callable[[pd.DataFrame], pd.Series] | None


@dataclass(frozen=True)
class Rows:
    """What a table's rows are, in words: the `noun` of one row, in `table`."""
    noun: str = "cell"
    table: str = "the summary"


CELLS = Rows()


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def _missing(value) -> bool:
    return value is None or value is pd.NA or (isinstance(value, float) and pd.isna(value))


def _short(reason, limit: int = MAX_REASON_CHARS) -> str:
    if _missing(reason) or not str(reason):
        return "no reason recorded"
    text = str(reason).splitlines()[0]
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _most_frequent(keys: list) -> list[tuple[object, int]]:
    """(key, count) pairs, most frequent first, ties in the keys' order (stable output)."""
    counts: dict = {}
    for key in keys:
        counts[key] = counts.get(key, 0) + 1
    return sorted(counts.items(), key=lambda item: (-item[1], item[0]))


def _reason_series(frame: pd.DataFrame, reasons: Reasons) -> pd.Series:
    if reasons is None:
        return pd.Series(pd.NA, index=frame.index, dtype="object")
    if callable(reasons):
        return reasons(frame)
    return frame[reasons] if reasons in frame else pd.Series(pd.NA, index=frame.index, dtype="object")


def _reasons(reasons: pd.Series) -> list[str]:
    """'reason (n cells)' lines, most frequent first."""
    counts = _most_frequent([_short(r) for r in reasons])
    lines = [f"{reason} ({_plural(n, 'cell')})" for reason, n in counts[:MAX_REASONS]]
    rest = sum(n for _, n in counts[MAX_REASONS:])
    if rest:
        lines.append(f"other reasons ({_plural(rest, 'cell')})")
    return lines


def _statuses(frame: pd.DataFrame) -> list[str]:
    """'n status: reason' lines for cells that did not finish ok, most frequent first."""
    counts = _most_frequent([(str(s), _short(r)) for s, r in zip(frame["status"], frame["reason"])])
    lines = [f"{n} {status}: {why}" for (status, why), n in counts[:MAX_REASONS]]
    rest = sum(n for _, n in counts[MAX_REASONS:])
    if rest:
        lines.append(f"{rest} more with other outcomes")
    return lines


def energy_reasons(frame: pd.DataFrame) -> pd.Series:
    """Why each row has no energy: its recorded energy reason where the table keeps one,
    else what its device says (a CPU has no NVML); missing where neither tells."""
    recorded = frame["energy_reason"] if "energy_reason" in frame else pd.Series(pd.NA, index=frame.index)
    on_cpu = frame["device_type"].astype("string").eq("cpu").fillna(False).astype(bool) \
        if "device_type" in frame else pd.Series(False, index=frame.index)
    derived = pd.Series(pd.NA, index=frame.index, dtype="object").mask(on_cpu, CPU_ENERGY_REASON)
    return recorded.astype("object").where(recorded.notna(), derived)


def no_cells_ok(frame: pd.DataFrame, rows: Rows = CELLS) -> str | None:
    """Why no row can be drawn at all (no rows, or none finished ok); None when some did."""
    if frame.empty:
        return f"{rows.table[0].upper()}{rows.table[1:]} has no {rows.noun}s."
    if (frame["status"] == "ok").any():
        return None
    return "\n".join([f"None of the {_plural(len(frame), rows.noun)} finished ok:", *_statuses(frame)])


def no_values(frame: pd.DataFrame, column: str, what: str, reasons: Reasons = None, rows: Rows = CELLS) -> str:
    """Why no ok row has a value in `column` (described to the reader as `what`); the
    reasons are those the rows give in the column `reasons` (`energy_reason` for what the
    energy window measures) or by the function `reasons` (`energy_reasons`), counted."""
    nothing_ok = no_cells_ok(frame, rows)
    if nothing_ok:
        return nothing_ok
    ok = frame[frame["status"] == "ok"]
    head = f"None of the {_plural(len(ok), 'ok ' + rows.noun)} has {what}"
    if reasons is None:
        return f"{head}."
    lines = _reasons(_reason_series(ok, reasons)[ok[column].isna()])
    return "\n".join([f"{head}.", "Reason recorded:" if len(lines) == 1 else "Reasons recorded:", *lines])


def rows_or_why(frame: pd.DataFrame, column: str, what: str, reasons: Reasons = None,
                rows: Rows = CELLS) -> tuple[pd.DataFrame, str | None]:
    """The ok rows of `frame` with a value in `column`, and None; or no rows and why."""
    ok = frame[(frame["status"] == "ok") & frame[column].notna()].copy()
    return (ok, None) if len(ok) else (ok, no_values(frame, column, what, reasons, rows))


def no_baseline(frame: pd.DataFrame, baseline: str) -> str | None:
    """Why no speedup over `baseline` can be drawn; None when one can."""
    nothing_ok = no_cells_ok(frame)
    if nothing_ok:
        return nothing_ok
    ran = frame[frame["kernel"] == baseline]
    if ran.empty:
        kernels = ", ".join(sorted(frame["kernel"].dropna().unique()))
        return f"{baseline} is not among this suite's kernels ({kernels}): no baseline to compare with."
    base_ok = ran[ran["status"] == "ok"]
    if base_ok.empty:
        return "\n".join([f"None of the {_plural(len(ran), baseline + ' cell')} finished ok:", *_statuses(ran)])
    return None


def missing_bar(cells: pd.DataFrame, column: str, reasons: Reasons = None, subject: str | None = None) -> str:
    """The mark of a bar that is not drawn, from the cells that would have made it: 'not in
    grid' where the suite has none (no record: the suite's grids leave it out); '<status>:' over its reason where none finished ok (the most
    frequent outcome; the reason without a leading `subject`, the backend the bar stands
    for); 'not measured:' over the reason where the ok ones have no value in `column`."""
    if cells.empty:
        return NOT_IN_GRID
    ok = cells[cells["status"] == "ok"]
    if len(ok):
        found = _most_frequent([str(r) for r in _reason_series(ok, reasons) if not _missing(r)])
        return "not measured" + (f":\n{_without(found[0][0], subject)}" if found else "")
    (status, reason), _ = _most_frequent([(str(s), "" if _missing(r) else str(r))
                                          for s, r in zip(cells["status"], cells["reason"])])[0]
    return f"{status}:\n{_without(reason, subject)}" if reason else status


def _without(reason: str, subject: str | None) -> str:
    """A reason said under its bar: the bar's own name, where the reason starts with it, left out."""
    if subject and reason.startswith(subject + " "):
        reason = reason[len(subject) + 1:]
    return _short(reason, MAX_MARK_CHARS)

"""Why a figure has nothing to draw, in words taken from the summary.

A figure with no data shows one of these sentences instead. Each is built from what the
cells recorded (their status, reason and energy reason), so a run on a machine without
a GPU reads "no CUDA device" rather than a guess, and the counts it gives are counts of
the cells it talks about.
"""
from __future__ import annotations

import pandas as pd

# Reasons listed at most, most frequent first; the rest are counted as "other reasons".
MAX_REASONS = 3
# A reason longer than this is cut (tracebacks' first lines can run to hundreds of characters).
MAX_REASON_CHARS = 90


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def _short(reason) -> str:
    if reason is None or reason is pd.NA or (isinstance(reason, float) and pd.isna(reason)) or not str(reason):
        return "no reason recorded"
    text = str(reason).splitlines()[0]
    return text if len(text) <= MAX_REASON_CHARS else text[: MAX_REASON_CHARS - 1] + "…"


def _most_frequent(keys: list) -> list[tuple[object, int]]:
    """(key, count) pairs, most frequent first, ties in the keys' order (stable output)."""
    counts: dict = {}
    for key in keys:
        counts[key] = counts.get(key, 0) + 1
    return sorted(counts.items(), key=lambda item: (-item[1], item[0]))


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


def no_cells_ok(frame: pd.DataFrame) -> str | None:
    """Why no cell can be drawn at all (no cells, or none finished ok); None when some did."""
    if frame.empty:
        return "The summary has no cells."
    if (frame["status"] == "ok").any():
        return None
    return "\n".join([f"None of the {_plural(len(frame), 'cell')} finished ok:", *_statuses(frame)])


def no_values(frame: pd.DataFrame, column: str, what: str, reason_column: str | None = None) -> str:
    """Why no ok cell has a value in `column` (described to the reader as `what`); the
    reasons are those the cells give in `reason_column` (`energy_reason` for what the
    energy window measures), counted."""
    nothing_ok = no_cells_ok(frame)
    if nothing_ok:
        return nothing_ok
    ok = frame[frame["status"] == "ok"]
    head = f"None of the {_plural(len(ok), 'ok cell')} has {what}"
    if reason_column is None:
        return f"{head}."
    reasons = _reasons(ok.loc[ok[column].isna(), reason_column])
    return "\n".join([f"{head}.", "Reason recorded:" if len(reasons) == 1 else "Reasons recorded:", *reasons])


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

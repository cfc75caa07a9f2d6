"""An attention cell's own repeats, read from its record: the time per call of each timed
step (flashwatt.timing keeps them), and the TFLOP/s each implies. `flashwatt compare`
draws a ratio's interval from them when a side has one run (flashwatt.compare.intervals).
Records written before the steps were kept have none: their interval comes from repeated
runs only."""
from __future__ import annotations


def latency_samples(record: dict) -> list[float]:
    """Milliseconds per call of each timed step."""
    return [float(ms) for ms in (record.get("timing") or {}).get("per_call_ms") or [] if ms]


def tflops_samples(record: dict) -> list[float]:
    """TFLOP/s of each timed step: the call's FLOPs over its time."""
    flops = (record.get("timing") or {}).get("flops_per_call")
    if not flops:
        return []
    return [flops / (ms * 1e-3) / 1e12 for ms in latency_samples(record)]

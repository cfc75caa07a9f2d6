"""What each side of a comparison was measured with, from its records' provenance: devices
and drivers, hosts, commits (and whether the checkout had changes), software, the
measurement settings, when, and how many runs. The report's header shows one column per side,
and the settings that differ between sides first."""
from __future__ import annotations

from collections import Counter

from flashwatt.compare.sides import Side


def _device(record: dict) -> str | None:
    device = record.get("device") or {}
    name = device.get("name")
    if name is None:
        return None
    return f"CPU {name}" if device.get("type") == "cpu" else name


def _driver(record: dict) -> str | None:
    nvml = (record.get("device") or {}).get("nvml") or []
    return nvml[0].get("driver_version") if nvml else None


def _commit(record: dict) -> str | None:
    git = (record.get("provenance") or {}).get("git") or {}
    commit = git.get("commit")
    if not commit:
        return None
    return f"{commit[:12]}{' (with changes)' if git.get('dirty') else ''}"


def _software(record: dict) -> str | None:
    soft = (record.get("provenance") or {}).get("software") or {}
    parts = [f"torch {soft['torch']}" if soft.get("torch") else None, f"CUDA {soft['cuda']}" if soft.get("cuda") else None]
    return ", ".join(p for p in parts if p) or None


def _settings(record: dict) -> dict:
    spec = record.get("settings") if record.get("kind", "attention") == "attention" else record.get("spec")
    return spec if isinstance(spec, dict) else {}


def _listed(counter: Counter) -> str:
    if not counter:
        return "not recorded"
    return "; ".join(f"{value} ({n})" if len(counter) > 1 else str(value) for value, n in counter.most_common())


def side_header(side: Side) -> dict:
    """{field: text} of one side, from every record its runs have."""
    fields = {name: Counter() for name in ("device", "driver", "host", "commit", "software")}
    settings: dict[str, Counter] = {}
    started = []
    suites: Counter = Counter()
    for run in side.runs:
        for kind_name, table in run.tables.items():
            for _, row in table.iterrows():
                suites[row.get("suite")] += 1
                record = run.record(row)
                if record is None:
                    continue
                for name, value in (("device", _device(record)), ("driver", _driver(record)),
                                    ("host", (record.get("provenance") or {}).get("host")),
                                    ("commit", _commit(record)), ("software", _software(record))):
                    if value:
                        fields[name][value] += 1
                for key, value in _settings(record).items():
                    if not isinstance(value, (dict, list)):
                        settings.setdefault(f"{kind_name}.{key}", Counter())[value] += 1
                if record.get("started"):
                    started.append(record["started"])
    header = {"named": ", ".join(side.named), "runs": str(len(side.runs)), "suite": _listed(suites)}
    header.update({name: _listed(counter) for name, counter in fields.items()})
    header["measured"] = f"{min(started)[:19]} to {max(started)[:19]} UTC" if started else "not recorded"
    return {"fields": header, "settings": {k: _listed(c) for k, c in sorted(settings.items())}}


def settings_rows(headers: list[dict]) -> list[tuple[str, list[str], bool]]:
    """(setting, its value on each side, whether the sides differ), differing ones first."""
    keys = sorted({k for h in headers for k in h["settings"]})
    rows = [(k, [h["settings"].get(k, "not set") for h in headers]) for k in keys]
    rows = [(k, values, len(set(values)) > 1) for k, values in rows]
    return sorted(rows, key=lambda r: not r[2])

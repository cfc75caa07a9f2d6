"""The comparison's report page: one HTML file beside its figures and tables.

The header has a column per side (what was named, runs, suites, devices and drivers, hosts,
commits, software, when) and the measurement settings, those that differ between the sides
first. Then, for each other side against the baseline and each kind: the summaries per
kernel and per shape family, the figures with their captions, every cell's ratios with their
intervals (marked where they are beyond noise), the cells on one side only, and the
regression check where one was asked for. The page has no script: it is read as it is, in
any browser, offline.
"""
from __future__ import annotations

import math
from pathlib import Path

import jinja2
from markupsafe import Markup
import pandas as pd

from flashwatt.compare.intervals import CONFIDENCE
from flashwatt.compare.join import BOTH

TEMPLATE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<title>{{ title }}</title>
<style>
body { font-family: sans-serif; margin: 2em; max-width: 90em; color: #222; }
table { border-collapse: collapse; margin: 0.6em 0 1.4em; font-size: 0.85em; }
th, td { border: 1px solid #bbb; padding: 0.2em 0.5em; text-align: left; vertical-align: top; }
th { background: #eee; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
.worse { color: #a00; font-weight: bold; }
.better { color: #0550ae; font-weight: bold; }
.differs { background: #fff3cd; }
figure { margin: 1em 0 2em; }
figure img { max-width: 100%; border: 1px solid #ddd; }
figcaption { font-size: 0.85em; color: #444; max-width: 60em; }
</style></head>
<body>
<h1>{{ title }}</h1>
<p>{{ method }}</p>
<h2>Sides</h2>
<table id="sides"><thead><tr><th></th>{% for side in sides %}<th>{{ side.label }}{% if loop.first %} (baseline){% endif %}</th>{% endfor %}</tr></thead>
<tbody>{% for field in header_fields %}<tr><th>{{ field }}</th>{% for side in sides %}<td>{{ side.header.fields[field] }}</td>{% endfor %}</tr>{% endfor %}</tbody></table>
<h3>Measurement settings</h3>
<table id="settings"><thead><tr><th>setting</th>{% for side in sides %}<th>{{ side.label }}</th>{% endfor %}</tr></thead>
<tbody>{% for key, values, differs in settings %}<tr{% if differs %} class="differs"{% endif %}><td>{{ key }}</td>{% for v in values %}<td>{{ v }}</td>{% endfor %}</tr>{% else %}<tr><td colspan="{{ sides|length + 1 }}">no record beside the tables: settings not known</td></tr>{% endfor %}</tbody></table>
{% if check %}<h2>Regression check</h2>
<p>Rules: {{ check.rules }}. {{ check.verdict }}</p>
{% if check.rows %}<table id="regressions"><thead><tr><th>against</th><th>kind</th><th>cell</th><th>rule</th><th>why</th></tr></thead>
<tbody>{% for r in check.rows %}<tr class="worse"><td>{{ r.other }}</td><td>{{ r.kind }}</td><td>{{ r.cell }}</td><td>{{ r.rule }}</td><td>{{ r.why }}</td></tr>{% endfor %}</tbody></table>{% endif %}
{% for note in check.notes %}<p>{{ note }}</p>{% endfor %}{% endif %}
{% for section in sections %}
<h2>{{ section.title }}</h2>
<p>{{ section.counts }}</p>
{% for name, table in section.summaries %}<h3>{{ name }}</h3>{{ table }}{% endfor %}
{% for fig in section.figures %}<figure><img src="{{ fig.src }}" alt="{{ fig.alt }}"><figcaption>{{ fig.caption }}</figcaption></figure>{% endfor %}
<h3>Every cell</h3>{{ section.cells }}
{% if section.one_side %}<h3>Cells on one side only</h3>{{ section.one_side }}{% endif %}
{% endfor %}
</body></html>
"""
HEADER_FIELDS = ["named", "runs", "suite", "device", "driver", "host", "commit", "software", "measured"]


def _fmt(value) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def html_table(frame: pd.DataFrame, table_id: str, classes: dict | None = None) -> str:
    """A table with a header row, numbers right-aligned and each row's class where given."""
    if frame.empty:
        return "<p>none</p>"
    env = jinja2.Environment(autoescape=True)
    template = env.from_string(
        '<table id="{{ id }}"><thead><tr>{% for c in cols %}<th>{{ c }}</th>{% endfor %}</tr></thead><tbody>'
        '{% for cls, row in rows %}<tr{% if cls %} class="{{ cls }}"{% endif %}>'
        '{% for v, num in row %}<td{% if num %} class="num"{% endif %}>{{ v }}</td>{% endfor %}</tr>{% endfor %}'
        '</tbody></table>')
    rows = []
    for i, (_, row) in enumerate(frame.iterrows()):
        cls = (classes or {}).get(i, "")
        rows.append((cls, [(_fmt(v), isinstance(v, (int, float)) and not isinstance(v, bool)) for v in row]))
    return template.render(id=table_id, cols=list(frame.columns), rows=rows)


def _ratio_text(row: pd.Series, metric) -> str:
    ratio = row[f"{metric.name}_ratio"]
    if pd.isna(ratio):
        return ""
    low, high = row[f"{metric.name}_low"], row[f"{metric.name}_high"]
    interval = f" [{low:.3f}, {high:.3f}]" if pd.notna(low) else ""
    return f"{ratio:.3f}{interval} {row[f'{metric.name}_change']}"


def cells_table(cells: pd.DataFrame, metrics: list, table_id: str) -> str:
    """Every cell on both sides: statuses, and per metric both values and the ratio."""
    out = pd.DataFrame({"cell": cells["cell"], "status": cells["status_base"] + " / " + cells["status_other"]})
    classes = {}
    for metric in metrics:
        out[f"{metric.label}: baseline"] = cells[f"{metric.name}_base"].to_numpy()
        out[f"{metric.label}: other"] = cells[f"{metric.name}_other"].to_numpy()
        out[f"{metric.name} ratio [{CONFIDENCE:.0%} interval]"] = [_ratio_text(r, metric) for _, r in cells.iterrows()]
    for i, (_, row) in enumerate(cells.iterrows()):
        changes = {row[f"{m.name}_change"] for m in metrics}
        classes[i] = "worse" if "worse" in changes else ("better" if "better" in changes else "")
    return html_table(out.reset_index(drop=True), table_id, classes)


def one_side_table(cells: pd.DataFrame, table_id: str) -> str:
    only = cells[cells["presence"] != BOTH]
    if only.empty:
        return ""
    frame = pd.DataFrame({"cell": only["cell"], "only on": only["presence"],
                          "status": only["status_base"].fillna(only["status_other"])})
    return html_table(frame.reset_index(drop=True), table_id)


def summary_table(summary: pd.DataFrame, by: str, table_id: str) -> str:
    if summary.empty:
        return "<p>no metric has a ratio for these cells</p>"
    frame = summary[[by, "label", "cells", "geomean_ratio", "low", "high", "worse", "better_cells", "within_noise",
                     "no_interval"]].rename(columns={"label": "metric", "geomean_ratio": "ratio (geometric mean)",
                                                     "low": "interval low", "high": "interval high",
                                                     "worse": "cells worse", "better_cells": "cells better",
                                                     "within_noise": "cells within noise",
                                                     "no_interval": "cells without interval"})
    return html_table(frame.reset_index(drop=True), table_id)


def render(title: str, method: str, sides: list, settings: list, sections: list, check: dict | None,
           out: Path) -> None:
    """Write the page (atomically: a reader never sees half of it)."""
    from flashwatt.records import atomic_write

    env = jinja2.Environment(autoescape=True, undefined=jinja2.StrictUndefined)
    html = env.from_string(TEMPLATE).render(title=title, method=method, sides=sides, header_fields=HEADER_FIELDS,
                                            settings=settings, sections=[_safe(s) for s in sections], check=check)
    atomic_write(out, lambda tmp: Path(tmp).write_text(html))


def _safe(section: dict) -> dict:
    """A section whose tables, built as HTML here, are inserted as they are."""
    out = dict(section)
    out["summaries"] = [(name, Markup(t)) for name, t in section["summaries"]]
    for key in ("cells", "one_side"):
        out[key] = Markup(section[key])
    return out

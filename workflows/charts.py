"""The workflow page's score trend drawn as inline SVG on the server (no JavaScript, no CDN), like
workflows/graph.py and evals/charts.py.

``score_trend_svg(runs)``: the eval scores of a workflow's versions over time (``selectors.workflow_eval_scores``),
one line per golden set (a score from one set is not comparable with another's), a point per eval run whose
tooltip names its version, set, score and date; the y axis is the score from 0 to 1, the x axis the time
from the first run to the last, and a legend names the sets by colour.

The drawing is deterministic (the same data give the same SVG). Every piece of text that comes from a user
(golden set names) goes through ``escape``; numbers and dates are formatted here.
"""

from __future__ import annotations

from django.utils import timezone
from django.utils.html import escape
from django.utils.safestring import SafeString

from config.svg import AXIS, BLUE, GREEN, MUTED, RED, clip, number, svg, x_axis, y_axis

SERIES_COLOURS = (BLUE, GREEN, "#8a5a00", "#7a2a80", RED, "#2a7f86")
TREND_W, TREND_H = 640, 250
LEFT, RIGHT, TOP, BOTTOM = 56, 40, 18, 78  # room on the right for the last date
LEGEND_SETS, LEGEND_COLUMNS = 6, 3  # sets named in the legend (more share the last colour), in rows of 3


def _moment(value, *, with_time: bool) -> str:
    local = timezone.localtime(value)
    return local.strftime("%m-%d %H:%M") if with_time else local.strftime("%Y-%m-%d")


def score_trend_svg(runs: list[dict], *, title: str = "Eval scores over time") -> SafeString:
    """Lines of `runs` ([{"at", "avg_score", "golden_set_id", "set_name", "version_hash"}], oldest first)."""
    plot_w, plot_h = TREND_W - LEFT - RIGHT, TREND_H - TOP - BOTTOM
    bottom = TOP + plot_h
    times = [run["at"] for run in runs]
    first, last = (min(times), max(times)) if times else (None, None)
    span = (last - first).total_seconds() if times else 0.0

    def x(moment) -> float:
        return LEFT + (plot_w * (moment - first).total_seconds() / span if span else plot_w / 2)

    def y(score: float) -> float:
        return TOP + plot_h * (1 - max(0.0, min(1.0, float(score))))

    parts = [y_axis("wf-trend", [(y(tick), number(tick)) for tick in (0, 0.25, 0.5, 0.75, 1)], left=LEFT,
                    right=LEFT + plot_w, middle=TOP + plot_h / 2, title="score")]
    with_time = span < 2 * 86400
    ticks = [(x(first), _moment(first, with_time=with_time))] if times else []
    if span:
        ticks = [(LEFT + plot_w * step / 4, _moment(first + (last - first) * step / 4, with_time=with_time))
                 for step in range(5)]
    parts.append(x_axis("wf-trend", ticks, left=LEFT, right=LEFT + plot_w, bottom=bottom, title="date of the eval run",
                        title_y=bottom + 34))
    series: dict[int, list[dict]] = {}
    for run in runs:
        series.setdefault(run["golden_set_id"], []).append(run)
    entries = []
    for index, (set_id, points) in enumerate(series.items()):
        colour = SERIES_COLOURS[min(index, len(SERIES_COLOURS) - 1)]
        name = points[0]["set_name"]
        entries.append((colour, clip(name, 30)))
        coordinates = [(x(point["at"]), y(point["avg_score"])) for point in points]
        parts.append(f'<g class="wf-trend-series" data-golden-set="{set_id}" data-runs="{len(points)}">')
        if len(coordinates) > 1:
            parts.append(f'<polyline fill="none" stroke="{colour}" stroke-width="1.8" points="'
                         + " ".join(f"{px:.1f},{py:.1f}" for px, py in coordinates) + '"/>')
        for point, (px, py) in zip(points, coordinates, strict=True):
            tooltip = (f"{name}: {point['avg_score']:.3f} · version {point['version_hash'][:12]} · "
                       f"{_moment(point['at'], with_time=True)}")
            parts.append(f'<circle class="wf-trend-point" cx="{px:.1f}" cy="{py:.1f}" r="3.5" fill="{colour}" '
                         f'data-score="{point["avg_score"]:.3f}"><title>{escape(tooltip)}</title></circle>')
        parts.append("</g>")
    if len(entries) > LEGEND_SETS:
        entries = [*entries[:LEGEND_SETS - 1], (entries[-1][0], f"and {len(entries) - LEGEND_SETS + 1} more sets")]
    for index, (colour, label) in enumerate(entries):
        column, row = index % LEGEND_COLUMNS, index // LEGEND_COLUMNS
        parts.append(f'<text class="wf-trend-legend" x="{LEFT + column * plot_w / LEGEND_COLUMNS:.1f}" '
                     f'y="{bottom + 54 + row * 16}" font-size="11" fill="{AXIS}"><tspan fill="{colour}">■</tspan> '
                     f'{escape(label)}</text>')
    if not runs:
        parts.append(f'<text x="{LEFT + plot_w / 2:.1f}" y="{TOP + plot_h / 2:.1f}" text-anchor="middle" '
                     f'font-size="13" fill="{MUTED}">no completed eval run yet</text>')
    count = len(runs)
    return svg("wf-trend", TREND_W, TREND_H, f"{title}: {count} eval run{'s' if count != 1 else ''} on "
               f"{len(series)} golden set{'s' if len(series) != 1 else ''}", "".join(parts))

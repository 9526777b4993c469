"""Charts of eval runs drawn as inline SVG on the server (no JavaScript, no CDN), like workflows/graph.py.

- ``histogram_svg(bins)``: one run's scores in equal bins over 0..1 (``evals.selectors.score_histogram``):
  a bar per bin with its count above it, the x axis labelled at every bin edge ("score"), the y axis with
  whole-number ticks ("items"). The last bin includes 1.0.
- ``paired_svg(pairs, label_a=, label_b=)``: a slope chart of a paired comparison. The left axis holds
  version a's score of each item, the right axis b's, and a line joins an item's two scores: green when
  b scores higher, red when lower, grey when equal. Items with the same two scores share one line (wider,
  its tooltip naming them all), so a hundred identical pairs do not hide behind each other. A critical
  item that regressed beyond the tolerance is drawn thick and dark red; the means of both sides are
  joined by a dashed black line. Items that only one side scored are not drawn (they are not paired).

The drawings are deterministic (the same data give the same SVG). Every piece of text that comes from a
user (item inputs, version labels) goes through ``escape``; numbers are formatted here.
"""

from __future__ import annotations

from django.utils.html import escape
from django.utils.safestring import SafeString

from config.svg import (
    AXIS,
    BLUE,
    DARK_RED,
    GREEN,
    GREY,
    GRID,
    INK,
    MUTED,
    RED,
    clip,
    count_ticks,
    number,
    svg,
    two_places,
    x_axis,
    y_axis,
)

UP, DOWN, SAME, CRITICAL = GREEN, RED, GREY, DARK_RED
TOOLTIP_ITEMS = 12  # items named in a shared line's tooltip


# ---------------------------------------------------------------------------------------- histogram

HIST_W, HIST_H = 600, 280
HIST_LEFT, HIST_RIGHT, HIST_TOP, HIST_BOTTOM = 56, 18, 22, 56


def histogram_svg(bins: list[dict], *, title: str = "Score histogram", threshold: float | None = None) -> SafeString:
    """Bars of `bins` ([{"low", "high", "count"}], as evals.selectors.score_histogram returns them, equal bins
    over 0..1), with `threshold` (a set's pass threshold) as a dashed line labelled "pass ≥ t"."""
    plot_w = HIST_W - HIST_LEFT - HIST_RIGHT
    plot_h = HIST_H - HIST_TOP - HIST_BOTTOM
    bottom = HIST_TOP + plot_h
    total = sum(int(b["count"]) for b in bins)
    ticks = count_ticks(max([int(b["count"]) for b in bins] or [0]), steps=5)
    top_value = ticks[-1]
    parts = [y_axis("ev", [(bottom - plot_h * tick / top_value, str(tick)) for tick in ticks], left=HIST_LEFT,
                    right=HIST_LEFT + plot_w, middle=HIST_TOP + plot_h / 2, title="items")]
    slot = plot_w / max(1, len(bins))
    parts.append('<g class="ev-bars">')
    for index, entry in enumerate(bins):
        count = int(entry["count"])
        height = plot_h * count / top_value
        x = HIST_LEFT + index * slot
        last = index == len(bins) - 1
        low, high = number(entry["low"]), number(entry["high"])
        label = (f"{low} to {high}{' (1 included)' if last else ''}: "
                 f"{count} item{'s' if count != 1 else ''}")
        parts.append(f'<g class="ev-hist-bin"><title>{escape(label)}</title>'
                     f'<rect class="ev-hist-bar" data-low="{low}" data-high="{high}" '
                     f'data-count="{count}" x="{x + 2:.1f}" y="{bottom - height:.1f}" width="{slot - 4:.1f}" '
                     f'height="{height:.1f}" fill="{BLUE}"/>')
        if count:
            parts.append(f'<text class="ev-hist-count" x="{x + slot / 2:.1f}" y="{bottom - height - 4:.1f}" '
                         f'text-anchor="middle" font-size="11" fill="{AXIS}">{count}</text>')
        parts.append("</g>")
    parts.append("</g>")
    edges = [entry["low"] for entry in bins] + ([bins[-1]["high"]] if bins else [])
    parts.append(x_axis("ev", [(HIST_LEFT + index * slot, number(edge)) for index, edge in enumerate(edges)],
                        left=HIST_LEFT, right=HIST_LEFT + plot_w, bottom=bottom, title="score", title_y=HIST_H - 12))
    if threshold is not None and 0 <= threshold <= 1:
        x = HIST_LEFT + plot_w * threshold
        parts.append(f'<g class="ev-threshold-mark"><title>items scoring {number(threshold)} or more pass</title>'
                     f'<line class="ev-threshold" x1="{x:.1f}" y1="{HIST_TOP - 6:.1f}" x2="{x:.1f}" y2="{bottom:.1f}" '
                     f'stroke="{INK}" stroke-width="1.5" stroke-dasharray="5 3"/>'
                     f'<text x="{x + 4:.1f}" y="{HIST_TOP + 4:.1f}" font-size="11" fill="{INK}">'
                     f'pass ≥ {number(threshold)}</text></g>')
    if not total:
        parts.append(f'<text x="{HIST_LEFT + plot_w / 2:.1f}" y="{HIST_TOP + plot_h / 2:.1f}" text-anchor="middle" '
                     f'font-size="13" fill="{MUTED}">no scored items</text>')
    return svg("ev-histogram", HIST_W, HIST_H, f"{title}: {total} scored item{'s' if total != 1 else ''}",
                "".join(parts))


# ------------------------------------------------------------------------------------- paired chart

PAIR_W, PAIR_H = 600, 340
PAIR_TOP, PAIR_BOTTOM = 44, 58
AXIS_A, AXIS_B = 170, 430


def _direction(a: float, b: float) -> str:
    return "up" if b > a else "down" if b < a else "same"


def paired_svg(pairs: list[dict], *, label_a: str, label_b: str, mean_a: float | None = None,
               mean_b: float | None = None) -> SafeString:
    """A slope chart of `pairs` ([{"label", "a", "b", "critical_regression"}], scores 0..1 or None)."""
    plot_h = PAIR_H - PAIR_TOP - PAIR_BOTTOM

    def y(score: float) -> float:
        return PAIR_TOP + plot_h * (1 - max(0.0, min(1.0, score)))

    paired = [p for p in pairs if p.get("a") is not None and p.get("b") is not None]
    groups: dict[tuple, list[dict]] = {}
    for pair in paired:
        groups.setdefault((round(float(pair["a"]), 4), round(float(pair["b"]), 4)), []).append(pair)
    parts = [f'<g class="ev-axis" font-size="11" fill="{MUTED}">']
    for tick in (0, 0.25, 0.5, 0.75, 1):
        parts.append(f'<line x1="{AXIS_A}" y1="{y(tick):.1f}" x2="{AXIS_B}" y2="{y(tick):.1f}" stroke="{GRID}"/>'
                     f'<text class="ev-tick" x="{AXIS_A - 10}" y="{y(tick) + 4:.1f}" text-anchor="end">'
                     f'{number(tick)}</text>'
                     f'<text class="ev-tick" x="{AXIS_B + 10}" y="{y(tick) + 4:.1f}">{number(tick)}</text>')
    for x, label in ((AXIS_A, label_a), (AXIS_B, label_b)):
        parts.append(f'<line x1="{x}" y1="{PAIR_TOP}" x2="{x}" y2="{PAIR_TOP + plot_h}" stroke="{AXIS}" '
                     f'stroke-width="1.4"/>')
        parts.append(f'<text class="ev-version-label" x="{x}" y="{PAIR_TOP - 16}" text-anchor="middle" '
                     f'font-size="12" font-weight="bold" fill="{AXIS}">{escape(clip(label, 40))}</text>')
    parts.append(f'<text class="ev-axis-title" x="{AXIS_A - 52}" y="{PAIR_TOP + plot_h / 2:.1f}" '
                 f'text-anchor="middle" transform="rotate(-90 {AXIS_A - 52} {PAIR_TOP + plot_h / 2:.1f})" '
                 f'fill="{AXIS}">score</text></g>')

    # regressions of critical items last, so they are drawn on top
    ordered = sorted(groups.items(), key=lambda kv: (any(p.get("critical_regression") for p in kv[1]), kv[0]))
    parts.append('<g class="ev-pairs">')
    for (a, b), members in ordered:
        critical = any(p.get("critical_regression") for p in members)
        direction = _direction(a, b)
        colour = CRITICAL if critical else {"up": UP, "down": DOWN, "same": SAME}[direction]
        width = 3.5 if critical else min(1.6 + 0.8 * (len(members) - 1), 8)
        names = [f"{clip(p['label'], 80)}" for p in members[:TOOLTIP_ITEMS]]
        if len(members) > TOOLTIP_ITEMS:
            names.append(f"and {len(members) - TOOLTIP_ITEMS} more")
        tooltip = (f"{len(members)} item{'s' if len(members) != 1 else ''}: a {two_places(a)} → b {two_places(b)} "
                   f"({b - a:+.2f}){', critical regression' if critical else ''}\n" + "\n".join(names))
        classes = f"ev-pair ev-pair-{direction}" + (" ev-pair-critical" if critical else "")
        parts.append(
            f'<g class="{classes}" data-items="{len(members)}" data-a="{two_places(a)}" data-b="{two_places(b)}">'
            f'<title>{escape(tooltip)}</title>'
            f'<line x1="{AXIS_A}" y1="{y(a):.1f}" x2="{AXIS_B}" y2="{y(b):.1f}" stroke="{colour}" '
            f'stroke-width="{width:.1f}" stroke-opacity="0.85" stroke-linecap="round"/>'
            f'<circle cx="{AXIS_A}" cy="{y(a):.1f}" r="3.5" fill="{colour}"/>'
            f'<circle cx="{AXIS_B}" cy="{y(b):.1f}" r="3.5" fill="{colour}"/></g>')
    parts.append("</g>")
    if mean_a is not None and mean_b is not None:
        parts.append(f'<g class="ev-pair-mean"><title>{escape(f"mean: a {mean_a:.3f} → b {mean_b:.3f}")}</title>'
                     f'<line x1="{AXIS_A}" y1="{y(mean_a):.1f}" x2="{AXIS_B}" y2="{y(mean_b):.1f}" stroke="#111" '
                     f'stroke-width="2" stroke-dasharray="6 4"/></g>')
    counts = {direction: sum(1 for p in paired if _direction(float(p["a"]), float(p["b"])) == direction)
              for direction in ("up", "down", "same")}
    legend = (f"{len(paired)} paired item{'s' if len(paired) != 1 else ''}: {counts['up']} higher in b, "
              f"{counts['down']} lower, {counts['same']} equal")
    if mean_a is not None and mean_b is not None:
        legend += f" · dashed: mean {mean_a:.3f} → {mean_b:.3f}"
    parts.append(f'<text class="ev-legend" x="{PAIR_W / 2:.0f}" y="{PAIR_H - 30}" text-anchor="middle" '
                 f'font-size="11" fill="{AXIS}">{escape(legend)}</text>'
                 f'<text class="ev-legend" x="{PAIR_W / 2:.0f}" y="{PAIR_H - 13}" text-anchor="middle" font-size="11" '
                 f'fill="{MUTED}"><tspan fill="{UP}">■</tspan> higher  <tspan fill="{DOWN}">■</tspan> lower  '
                 f'<tspan fill="{SAME}">■</tspan> equal  <tspan fill="{CRITICAL}">■</tspan> critical regression  '
                 f'(a wider line is several items)</text>')
    if not paired:
        parts.append(f'<text x="{PAIR_W / 2:.0f}" y="{PAIR_TOP + plot_h / 2:.1f}" text-anchor="middle" font-size="13" '
                     f'fill="{MUTED}">no item scored by both versions</text>')
    return svg("ev-paired", PAIR_W, PAIR_H, f"Paired scores of {label_a} and {label_b}: {legend}",
                "".join(parts))

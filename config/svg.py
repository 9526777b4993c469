"""What every chart and graph drawn as inline SVG on the server shares (no JavaScript, no CDN): the palette,
the frame (``svg``), the axes of a plot with a y scale (``y_axis``, ``x_axis``), whole-number ticks, the
formats of numbers, and ``clip`` for text from users.

Used by workflows/graph.py, evals/charts.py, evolution/charts.py and config/home_charts.py. The rule they keep:
every piece of text that reaches a drawing goes through ``escape`` (the frame escapes its title itself), and
numbers are formatted here or by the drawing; so ``svg`` may mark the whole as safe.
"""

from __future__ import annotations

import math

from django.utils.html import escape
from django.utils.safestring import SafeString, mark_safe

FONT = "-apple-system, Segoe UI, Roboto, Helvetica, Arial, sans-serif"

# the palette (on a white background; config/home_charts.py draws its axes in currentColor instead)
AXIS = "#40474f"  # axes, axis titles, the graph's sequential edges
GRID = "#e3e6e9"
MUTED = "#6b737b"  # tick labels, notes
GREEN = "#2f8a4c"  # better: a higher score, the best fitness
BLUE = "#3f83c4"  # a neutral series: bars, the average, a sparkline
RED = "#c9473c"  # worse: a lower score, the worst fitness
GREY = "#868f97"  # unchanged, pending, not evaluated (3.3:1 on white)
DARK_RED = "#7d0f08"  # critical: a critical regression, a dead run
SLATE = "#8a8f95"  # a reference: the base's fitness, waitFor edges
INK = "#1b2733"  # text on a node, a line of descent
OUTLINE = "#5b6770"  # a node's outline and its secondary text


def clip(text: str, limit: int) -> str:
    """`text` on one line (runs of whitespace as one space), at most `limit` characters with an ellipsis."""
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def number(value: float | None) -> str:
    """A score or an axis value: at most two decimals, no trailing zeros (0, 0.1, 0.25, 1)."""
    return f"{value:.2f}".rstrip("0").rstrip(".") if value is not None else "-"


def two_places(value: float | None) -> str:
    """A score or a fitness in a tooltip: two decimals, "-" for none."""
    return "-" if value is None else f"{value:.2f}"


def count_ticks(peak: int, *, steps: int) -> list[int]:
    """Whole-number ticks from 0 to at least `peak`, about `steps` intervals of them."""
    step = max(1, math.ceil(peak / steps))
    return list(range(0, max(step, math.ceil(peak / step) * step) + 1, step))


def svg(css_class: str, width: float, height: float, title: str, body: str, defs: str = "") -> SafeString:
    """The <svg> element of a drawing: `title` (escaped here) names it for a screen reader and as a tooltip."""
    svg = (f'<svg xmlns="http://www.w3.org/2000/svg" class="{css_class}" role="img" width="{width:.0f}" '
           f'height="{height:.0f}" viewBox="0 0 {width:.0f} {height:.0f}" font-family="{FONT}">'
           f'<title>{escape(title)}</title>{defs}{body}</svg>')
    return mark_safe(svg)  # noqa: S308 - every piece of text in body and title went through escape()


def y_axis(prefix: str, ticks: list[tuple[float, str]], *, left: float, right: float, middle: float, title: str,
           tick_class: str = "") -> str:
    """The y axis of a plot from `left` to `right`: a grid line and a label for each (y, label) of `ticks`, and
    `title` turned along the axis at the height `middle`; classes `<prefix>-axis`, `<prefix>-axis-y`."""
    label_class = f'class="{tick_class}" ' if tick_class else ""
    parts = [f'<g class="{prefix}-axis {prefix}-axis-y" font-size="11" fill="{MUTED}">']
    for y, label in ticks:
        parts.append(f'<line x1="{left}" y1="{y:.1f}" x2="{right}" y2="{y:.1f}" stroke="{GRID}"/>'
                     f'<text {label_class}x="{left - 6}" y="{y + 4:.1f}" text-anchor="end">{label}</text>')
    parts.append(f'<text class="{prefix}-axis-title" x="16" y="{middle:.1f}" text-anchor="middle" '
                 f'transform="rotate(-90 16 {middle:.1f})" fill="{AXIS}">{title}</text></g>')
    return "".join(parts)


def x_axis(prefix: str, ticks: list[tuple[float, str]], *, left: float, right: float, bottom: float, title: str,
           title_y: float) -> str:
    """The x axis of a plot along `bottom`: a tick mark and a label for each (x, label) of `ticks`, and `title`
    centred under it at `title_y`; classes `<prefix>-axis`, `<prefix>-axis-x`, `<prefix>-tick`."""
    parts = [f'<g class="{prefix}-axis {prefix}-axis-x" font-size="11" fill="{MUTED}">'
             f'<line x1="{left}" y1="{bottom}" x2="{right}" y2="{bottom}" stroke="{AXIS}"/>']
    for x, label in ticks:
        parts.append(f'<line x1="{x:.1f}" y1="{bottom}" x2="{x:.1f}" y2="{bottom + 4}" stroke="{AXIS}"/>'
                     f'<text class="{prefix}-tick" x="{x:.1f}" y="{bottom + 17}" text-anchor="middle">{label}</text>')
    parts.append(f'<text class="{prefix}-axis-title" x="{(left + right) / 2:.1f}" y="{title_y}" '
                 f'text-anchor="middle" fill="{AXIS}">{title}</text></g>')
    return "".join(parts)

"""The home's charts as inline SVG drawn on the server (no JavaScript, no CDN), like evals/charts.py.

- ``status_svg(series)``: rows by status over the window's buckets, a stacked bar per bucket. The
  highlighted statuses (failed, dead, suspended; an invocation's failed and waiting) sit at the bottom of
  each bar in strong colours, the others above them in muted ones; each segment links to the list of its
  rows (status and bucket) and names them in its tooltip.
- ``sparkline_svg(values)``: a small line of scores, oldest to newest, the newest marked; its height spans the
  scores' own range (at least 0.1 of the 0..1 scale), so a trend of a few hundredths still shows.

Text and axes draw in `currentColor`, so the charts follow the admin's light and dark themes. Every piece
of text goes through ``escape``; numbers are formatted here.
"""

from __future__ import annotations

import math

from django.utils import timezone
from django.utils.html import escape
from django.utils.safestring import SafeString

from config.svg import BLUE, DARK_RED, GREY, count_ticks, svg

GRID = "#8884"  # translucent grey: readable on the light and the dark theme

STATUS_COLOURS = {
    "failed": "#d1382c", "dead": DARK_RED, "suspended": "#e09400", "waiting": "#e09400",
    "running": BLUE, "pending": GREY, "queued": GREY, "completed": "#8cc29c",
    "cancelled": "#c4c9ce",
}

W, H = 620, 190
LEFT, RIGHT, TOP, BOTTOM = 40, 10, 12, 26


def _bucket_label(moment, bucket: str) -> str:
    local = timezone.localtime(moment)
    return local.strftime("%m-%d") if bucket == "day" else local.strftime("%H:%M")


def _tick_every(count: int, bucket: str, starts) -> list[int]:
    """Which buckets get an x label: midnights of a week of hours, else about seven evenly spaced."""
    if bucket == "hour" and count > 48:
        return [index for index, start in enumerate(starts) if timezone.localtime(start).hour == 0]
    step = max(1, math.ceil(count / 7))
    return list(range(0, count, step))


def status_svg(series, *, bucket: str) -> SafeString:
    """A stacked bar per bucket of `series` (config.home.StatusSeries)."""
    plot_w, plot_h = W - LEFT - RIGHT, H - TOP - BOTTOM
    bottom = TOP + plot_h
    buckets = series.buckets
    peak = max([sum(b.counts.values()) for b in buckets] or [0])
    ticks = count_ticks(peak, steps=4)
    top_value = ticks[-1]
    parts = ['<g class="home-axis" font-size="10" fill="currentColor" fill-opacity="0.7">']
    for tick in ticks:
        y = bottom - plot_h * tick / top_value
        parts.append(f'<line x1="{LEFT}" y1="{y:.1f}" x2="{LEFT + plot_w}" y2="{y:.1f}" stroke="{GRID}"/>'
                     f'<text x="{LEFT - 5}" y="{y + 3.5:.1f}" text-anchor="end">{tick}</text>')
    parts.append("</g>")
    slot = plot_w / max(1, len(buckets))
    gap = 1 if slot >= 4 else 0
    parts.append('<g class="home-bars">')
    for index, entry in enumerate(buckets):
        x = LEFT + index * slot
        height_so_far = 0.0
        span = f"{_bucket_label(entry.start, bucket)} to {_bucket_label(entry.end, bucket)}"
        for status, label in series.statuses:
            count = entry.counts.get(status, 0)
            if not count:
                continue
            height = plot_h * count / top_value
            y = bottom - height_so_far - height
            height_so_far += height
            tooltip = f"{span}: {count:,} {label.lower()}"
            parts.append(
                f'<a href="{escape(series.link(status, entry))}" class="home-bar home-bar-{status}">'
                f'<rect x="{x + gap / 2:.2f}" y="{y:.2f}" width="{max(slot - gap, 0.8):.2f}" height="{height:.2f}" '
                f'fill="{STATUS_COLOURS.get(status, "#9aa3ab")}" data-count="{count}"><title>{escape(tooltip)}'
                f'</title></rect></a>')
    parts.append("</g>")
    parts.append(f'<g class="home-axis" font-size="10" fill="currentColor" fill-opacity="0.7">'
                 f'<line x1="{LEFT}" y1="{bottom}" x2="{LEFT + plot_w}" y2="{bottom}" stroke="currentColor" '
                 f'stroke-opacity="0.5"/>')
    tick_kind = "day" if bucket == "hour" and len(buckets) > 48 else bucket
    for index in _tick_every(len(buckets), bucket, [b.start for b in buckets]):
        x = LEFT + index * slot
        parts.append(f'<line x1="{x:.1f}" y1="{bottom}" x2="{x:.1f}" y2="{bottom + 3}" stroke="currentColor" '
                     f'stroke-opacity="0.5"/><text x="{x:.1f}" y="{bottom + 14}" text-anchor="start">'
                     f'{escape(_bucket_label(buckets[index].start, tick_kind))}</text>')
    parts.append("</g>")
    if not series.total:
        parts.append(f'<text x="{LEFT + plot_w / 2:.1f}" y="{TOP + plot_h / 2:.1f}" text-anchor="middle" '
                     f'font-size="13" fill="currentColor" fill-opacity="0.6">nothing in this window</text>')
    summary = ", ".join(f"{series.totals.get(status, 0):,} {label.lower()}" for status, label in series.statuses
                        if series.totals.get(status))
    return svg("home-status-chart", W, H, f"{series.title}: {summary or 'none'}", "".join(parts))


SPARK_W, SPARK_H = 140, 30
SPARK_MIN_RANGE = 0.1


def sparkline_svg(values: list[float], *, title: str) -> SafeString:
    """Scores 0..1 oldest to newest as a line, the newest a dot; one value is a dot alone."""
    pad = 3
    middle = (max(values, default=0.5) + min(values, default=0.5)) / 2
    half = max(SPARK_MIN_RANGE, max(values, default=0) - min(values, default=0)) / 2
    low = max(0.0, min(middle - half, 1.0 - 2 * half))

    def point(index: int, value: float) -> tuple[float, float]:
        x = pad + (SPARK_W - 2 * pad) * (index / (len(values) - 1) if len(values) > 1 else 1)
        return x, pad + (SPARK_H - 2 * pad) * (1 - (value - low) / (2 * half))

    points = [point(index, value) for index, value in enumerate(values)]
    body = ""
    if len(points) > 1:
        body += (f'<polyline fill="none" stroke="{BLUE}" stroke-width="1.6" points="'
                 + " ".join(f"{x:.1f},{y:.1f}" for x, y in points) + '"/>')
    if points:
        x, y = points[-1]
        body += f'<circle cx="{x:.1f}" cy="{y:.1f}" r="2.6" fill="{BLUE}"/>'
    return svg("home-sparkline", SPARK_W, SPARK_H, title, body)

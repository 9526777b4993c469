"""How the admin pages write numbers and texts: one home, so a score, a rate, a cost or a JSON value reads the same on
every page (and in the commands).

Scores (0..1) to three places, rates as whole percents, US dollars with the precision their size needs
("$4.23", "$0.0270", "$0.000012"), durations in the unit that suits them. None is "-" everywhere."""

from __future__ import annotations

import json
from decimal import Decimal

from django.contrib import admin
from django.contrib.admin.utils import quote
from django.urls import reverse
from django.utils.html import format_html

DASH = "-"


def score(value: float | None, digits: int = 3) -> str:
    return DASH if value is None else f"{value:.{digits}f}"


def percent(value: float | None) -> str:
    return DASH if value is None else f"{value * 100:.0f}%"


def usd(amount) -> str:
    """Cents from a dollar up, four places below it, and two significant digits under a hundredth of a cent
    (a cheap model's call), so nothing paid ever reads as "$0.0000"."""
    if amount is None:
        return DASH
    value = Decimal(str(amount))
    size = abs(value)
    if size == 0:
        return "$0.00"
    places = 2 if size >= 1 else 4 if size >= Decimal("0.0001") else 1 - size.adjusted()
    return f"{'-' if value < 0 else ''}${size:,.{places}f}"


def seconds(value: float | None) -> str:
    if value is None:
        return DASH
    if value < 1:
        return f"{value * 1000:.0f} ms"
    if value < 120:
        return f"{value:.1f} s"
    if value < 7200:
        return f"{value / 60:.1f} min"
    return f"{value / 3600:.1f} h"


FORMATS = {"score": score, "percent": percent, "usd": usd}


def number_field(field: str, kind: str, description: str | None = None):
    """An admin column or read-only field showing the model field `field` as a `kind` ("score", "usd",
    "percent"); sortable by the field. Assign it in the ModelAdmin's body: `usd_cost_text = number_field(...)`."""
    write = FORMATS[kind]

    @admin.display(description=description or field.replace("_", " "), ordering=field)
    def show(self, obj):
        return write(getattr(obj, field))

    return show


def moment(value) -> str:
    """A date and time in the current time zone, compact enough for a list column ("2026-12-01 10:17:05")."""
    from django.utils import timezone

    return DASH if value is None else timezone.localtime(value).strftime("%Y-%m-%d %H:%M:%S")


def ago(value) -> str:
    """How long ago a moment was, as Django's naturaltime says it ("3 minutes ago", "now"); "-" for None."""
    from django.contrib.humanize.templatetags.humanize import naturaltime

    return DASH if value is None else str(naturaltime(value))


def status_badge(status: str, label: str):
    """A status as a coloured pill (the `wf-status` styles of admin/workflows/_styles.html)."""
    return format_html('<span class="wf-status wf-status-{}">{}</span>', status, label)


# ---------------------------------------------------------------------------------------- texts and JSON

TEXT_LIMIT = 20_000  # characters of one message or node output shown on a page


def pretty_json(value) -> str:
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False, default=str)


def json_html(value):
    if value is None or value == "" or value == {} or value == []:
        return "-"
    return format_html('<pre class="wf-json">{}</pre>', pretty_json(value))


def clipped(text: str, limit: int = TEXT_LIMIT) -> str:
    if len(text) <= limit:
        return text
    return f"{text[:limit]}\n… ({len(text) - limit:,} more characters)"


def excerpt(text: str, limit: int) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def durable_run_link(run_id: str | None):
    if not run_id:
        return "-"
    return format_html('<a href="{}">{}</a>', reverse("admin:durable_durablerun_change", args=[quote(run_id)]),
                       run_id)


def diff_lines(lines: list[str], *, prefix: str) -> list[tuple[str, str]]:
    """A unified diff's lines with the class that colours them: `<prefix>-diff-add`, `-del`, `-hunk` (the file
    and hunk headers) or none (context)."""
    kinds = []
    for line in lines:
        if line.startswith(("+++", "---", "@@")):
            kinds.append((f"{prefix}-diff-hunk", line))
        elif line.startswith("+"):
            kinds.append((f"{prefix}-diff-add", line))
        elif line.startswith("-"):
            kinds.append((f"{prefix}-diff-del", line))
        else:
            kinds.append(("", line))
    return kinds

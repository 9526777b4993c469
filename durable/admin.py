"""The operator dashboard for durable runs: read-only runs with their timeline, actions that act
only on eligible runs, editable schedules, read-only buffered signals and events."""

from __future__ import annotations

import copy
import json
import re
from urllib.parse import quote as url_quote

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.models import CHANGE, LogEntry
from django.contrib.admin.options import IncorrectLookupParameters
from django.contrib.admin.utils import quote, unquote
from django.contrib.contenttypes.models import ContentType
from django.core.exceptions import PermissionDenied, ValidationError
from django.db import connection, transaction
from django.db.models import DurationField, ExpressionWrapper, F, Q
from django.db.models.functions import Coalesce, Now
from django.http import Http404, HttpResponseNotAllowed
from django.template.response import TemplateResponse
from django.urls import NoReverseMatch, path, reverse, reverse_lazy
from django.utils import timezone
from django.utils.functional import cached_property
from django.utils.html import escape, format_html, format_html_join
from django.utils.safestring import mark_safe

from config.admin import CreatedWithinFilter, EstimatedCountPaginator, PostActionsMixin, ReadOnlyAdmin
from config.display import ago, moment, pretty_json, status_badge
from config.display import seconds as seconds_text
from config.home_charts import GRID, STATUS_COLOURS
from config.svg import clip
from config.svg import svg as svg_root
from durable import owners, selectors, services
from durable.codec import decode, decode_strict
from durable.errors import InvalidFilter, InvalidRunState, RunNotFound, Undecodable, UnknownWorkflow
from durable.models import BufferedEvent, BufferedSignal, DurableRun, RunAttribute, Schedule
from durable.registry import get_workflow, workflow_names
from durable.schedules import validate_schedule
from workspaces.admin_scope import WorkspaceScopedAdmin, per_request, sees_everything, workspaces_for

UNDECODABLE = "(undecodable)"
TIMELINE_LIMIT = 500


def payload_html(text: str, *, column: str, row: str):
    """A stored payload as pretty JSON; a corrupt one shows "(undecodable)" (reported once) and never raises."""
    if not text:
        return "-"
    try:
        value = decode_strict(text)
    except Undecodable:
        decode(text, column=column, row=row)
        return format_html('<span class="undecodable">{}</span>', UNDECODABLE)
    return format_html('<pre class="durable-json">{}</pre>', pretty_json(value))


class WorkflowFilter(admin.SimpleListFilter):
    """Choices from the workflow registry: no DISTINCT over the runs table."""

    title = "workflow"
    parameter_name = "workflow"

    def lookups(self, request, model_admin):
        return [(name, name) for name in workflow_names()]

    def queryset(self, request, queryset):
        return queryset.filter(workflow=self.value()) if self.value() else queryset


class NamespaceFilter(admin.SimpleListFilter):
    """Choices from the workspaces (namespace "ws-<pk>") plus "default": no DISTINCT over the runs table."""

    title = "namespace"
    parameter_name = "namespace"

    def lookups(self, request, model_admin):
        # once a request: the changelist builds its filters again for each facet count
        return per_request(request, "durable-namespaces", lambda: [
            *([("default", "default")] if sees_everything(request) else []),
            *((workspace.namespace, f"{workspace.name} ({workspace.namespace})")
              for workspace in workspaces_for(request).order_by("name")[:200])])

    def queryset(self, request, queryset):
        return queryset.filter(namespace=self.value()) if self.value() else queryset


class SignalForm(forms.Form):
    name = forms.CharField(max_length=255)
    payload = forms.CharField(widget=forms.Textarea(attrs={"rows": 6, "cols": 60}), required=False,
                              help_text="JSON; empty sends null.")

    def clean_payload(self):
        text = self.cleaned_data["payload"].strip()
        if not text:
            return None
        try:
            return json.loads(text)
        except ValueError as exc:
            raise ValidationError(f"Not valid JSON: {exc}") from None


def error_html(value, *, undecodable: bool = False):
    """A stored error ({"type", "message", "traceback", ...}) as an operator reads it: the type and message,
    any other facts, then the traceback in a <pre>; a plain value is the message."""
    if undecodable:
        return format_html('<span class="undecodable">{}</span>', UNDECODABLE)
    if value is None or value == "":
        return "-"
    error = value if isinstance(value, dict) else {"message": value}
    kind, message, trace = error.get("type"), error.get("message"), error.get("traceback")
    message = message if isinstance(message, str) else pretty_json(message) if message is not None else ""
    facts = format_html_join("", '<li><b>{}</b> {}</li>', (
        (key, item if isinstance(item, str) else pretty_json(item))
        for key, item in sorted(error.items()) if key not in ("type", "message", "traceback")))
    return format_html(
        '<div class="durable-error"><p class="durable-error-message">{}{}</p>{}{}</div>',
        format_html("<strong>{}</strong>{}", kind, ": " if message else "") if kind else "", message,
        format_html('<ul class="durable-error-facts">{}</ul>', facts) if facts else "",
        format_html('<pre class="durable-traceback">{}</pre>', trace) if trace else "",
    )


def error_summary(text: str, *, row: str) -> str:
    """A stored error in one line ("StepFailed: step 'check' failed ..."), for the admin's log."""
    value = decode(text, column="run.error", row=row) if text else None
    if not isinstance(value, dict):
        return "" if value is None else str(value)
    return ": ".join(str(part) for part in (value.get("type"), value.get("message")) if part)


# ------------------------------------------------------------------------------- the steps' Gantt chart
# Rows come from selectors.run_gantt (a fan folded into one row); positions are seconds from the run's start.

GANTT_ROWS = 200  # rows drawn unless "show all" is asked
GANTT_ALL_ROWS = 5_000
GANTT_W, GANTT_LABEL_W, GANTT_META_W, GANTT_ROW_H, GANTT_TOP = 940, 230, 150, 18, 22


def gantt_svg(rows: list[selectors.GanttRow], *, origin, finish, active: bool):
    """The rows as bars over the run's span, an axis of elapsed time on top; a row still open when the run
    is active ends now. Each bar's tooltip names it, its status, start offset and duration."""
    now = timezone.now()
    plot_x, plot_w = GANTT_LABEL_W, GANTT_W - GANTT_LABEL_W - GANTT_META_W
    ends = [row.end or row.start for row in rows if row.start]
    origin = origin or min((row.start for row in rows if row.start), default=now)
    finish = max([finish or origin, *ends, now if active else origin])
    total = max((finish - origin).total_seconds(), 0.001)
    height = GANTT_TOP + GANTT_ROW_H * len(rows) + 4
    parts = ['<g font-size="10" fill="currentColor" fill-opacity="0.7">']
    for fraction in (0, 0.25, 0.5, 0.75, 1):
        x = plot_x + plot_w * fraction
        anchor = "start" if fraction == 0 else "end" if fraction == 1 else "middle"
        parts.append(f'<line x1="{x:.1f}" y1="{GANTT_TOP - 4}" x2="{x:.1f}" y2="{height}" stroke="{GRID}"/>'
                     f'<text x="{x:.1f}" y="{GANTT_TOP - 8}" text-anchor="{anchor}">'
                     f'{escape(seconds_text(total * fraction))}</text>')
    parts.append("</g>")
    for index, row in enumerate(rows):
        y = GANTT_TOP + index * GANTT_ROW_H
        start = row.start or origin
        end = row.end or (now if active and row.open else start)
        left = min(max((start - origin).total_seconds() / total, 0), 1) * plot_w
        width = max(min((end - start).total_seconds() / total * plot_w, plot_w - left), 2)
        duration = seconds_text((end - start).total_seconds())
        noun = ("child" if row.count == 1 else "children") if row.kind == "child" else \
            ("step" if row.count == 1 else "steps")
        label = (f"{row.name}: {row.count} {noun}"
                 if row.parallel_group is not None else f"#{row.seq} {row.name}")
        counts = f", {row.failed} failed" if row.failed else ""
        counts += f", {row.open} open" if row.open else ""
        meta = f"{row.status}{counts} · {duration}{'…' if row.end is None and row.open else ''}"
        offset = seconds_text((start - origin).total_seconds())
        tooltip = f"{label} ({row.kind}): {row.status}{counts}, from +{offset}, {duration}"
        parts.append(
            f'<g class="durable-gantt-row durable-gantt-{escape(row.status)}" data-seq="{row.seq}">'
            f'<title>{escape(tooltip)}</title>'
            f'<text x="0" y="{y + 13}" font-size="11" fill="currentColor">{escape(clip(label, 36))}</text>'
            f'<rect x="{plot_x}" y="{y + 3}" width="{plot_w}" height="12" fill="{GRID}" fill-opacity="0.35"/>'
            f'<rect x="{plot_x + left:.2f}" y="{y + 3}" width="{width:.2f}" height="12" rx="2" '
            f'fill="{STATUS_COLOURS.get(row.status, "#9aa3ab")}"/>'
            f'<text x="{plot_x + plot_w + 8}" y="{y + 13}" font-size="10" fill="currentColor" fill-opacity="0.75">'
            f'{escape(clip(meta, 30))}</text></g>')
    title = f"Steps over {seconds_text(total)}: {len(rows)} rows"
    return svg_root("durable-gantt", GANTT_W, height, title, "".join(parts)), seconds_text(total)


# ----------------------------------------------------------------------------------------- list filters

class TagFilter(admin.SimpleListFilter):
    """Runs carrying a tag (the tags GIN index); the choices are the tags of the latest runs the user sees
    (read through the created_at index), plus the tag asked for."""

    title = "tag"
    parameter_name = "tag"
    RECENT = 1000

    def lookups(self, request, model_admin):
        def recent_tags():
            latest = model_admin.get_queryset(request).order_by("-created_at").values("tags")[:self.RECENT]
            sql, params = latest.query.sql_with_params()
            with connection.cursor() as cursor:
                cursor.execute(f"SELECT DISTINCT unnest(tags) AS tag FROM ({sql}) AS latest ORDER BY tag LIMIT 50",
                               params)
                return [row[0] for row in cursor.fetchall()]

        tags = per_request(request, "durable-recent-tags", recent_tags)
        asked = self.value()
        return [(tag, tag) for tag in sorted({*tags, *([asked] if asked else [])})]

    def queryset(self, request, queryset):
        return queryset.filter(tags__contains=[self.value()]) if self.value() else queryset


class AttributeParamFilter(admin.SimpleListFilter):
    """Runs by a search attribute, `?attr=key:op:value` (op eq, ne, gt, gte, lt, lte), as the run page's
    attributes link to it; served by the attributes' (key, value) and (key, value_num) indexes."""

    title = "attribute"
    parameter_name = "attr"

    def lookups(self, request, model_admin):
        return [(self.value(), self.value())] if self.value() else []

    def queryset(self, request, queryset):
        if not self.value():
            return queryset
        try:
            return selectors.run_filter(queryset, attributes=[selectors.AttributeFilter.parse(self.value())])
        except InvalidFilter as exc:
            raise IncorrectLookupParameters(exc.message) from None


class ParentFilter(admin.SimpleListFilter):
    """The children of one run, `?parent=<run id>`, as the run page's children link to it."""

    title = "parent run"
    parameter_name = "parent"

    def lookups(self, request, model_admin):
        return [(self.value(), self.value())] if self.value() else []

    def queryset(self, request, queryset):
        return queryset.filter(parent_id=self.value()) if self.value() else queryset


class ChildrenFilter(admin.SimpleListFilter):
    """Child runs are folded under their parent: the list shows top-level runs unless children are asked
    for, a parent is chosen or a run is searched for."""

    title = "child runs"
    parameter_name = "children"

    def lookups(self, request, model_admin):
        return [("show", "Show child runs")]

    def choices(self, changelist):
        yield {"selected": self.value() is None, "query_string": changelist.get_query_string(remove=[
            self.parameter_name]), "display": "Top-level runs only"}
        yield {"selected": self.value() == "show", "query_string": changelist.get_query_string(
            {self.parameter_name: "show"}), "display": "Show child runs"}

    def queryset(self, request, queryset):
        if self.value() == "show" or request.GET.get("parent") or request.GET.get("q", "").strip():
            return queryset
        return queryset.filter(parent__isnull=True)


# -------------------------------------------------------------------------------------------- the runs

class RunsPaginator(EstimatedCountPaginator):
    """The default list, top-level runs only, is filtered by nothing but `parent IS NULL`: its count is the
    planner's estimate (EXPLAIN, about 1 ms), as the unfiltered table's is reltuples, instead of a COUNT(*)
    over every top-level run; small tables and other filters count exactly."""

    @cached_property
    def count(self):
        query = getattr(self.object_list, "query", None)
        if query is not None and query.where == DurableRun.objects.filter(parent__isnull=True).query.where:
            sql, params = self.object_list.order_by().values("pk").query.sql_with_params()
            with connection.cursor() as cursor:
                cursor.execute(f"EXPLAIN (FORMAT JSON) {sql}", params)
                plan = cursor.fetchone()[0]
            plan = json.loads(plan) if isinstance(plan, str) else plan
            estimate = int(plan[0]["Plan"]["Plan Rows"])
            if estimate >= self.exact_below:
                return estimate
        return super().count



@admin.register(DurableRun)
class DurableRunAdmin(PostActionsMixin, WorkspaceScopedAdmin, ReadOnlyAdmin):
    namespace_field = "namespace"
    # compact columns, so the list fits a laptop screen beside the filters
    list_display = ("id", "workflow_name", "namespace", "status_display", "created", "duration_display", "turns",
                    "recoveries")
    list_filter = ("status", CreatedWithinFilter, ChildrenFilter, WorkflowFilter, NamespaceFilter, TagFilter,
                   AttributeParamFilter, ParentFilter)
    search_fields = ("id",)
    search_help_text = "A run id, an attribute value, or key=value for one attribute."
    ordering = ("-created_at", "-id")
    show_full_result_count = False
    paginator = RunsPaginator
    list_per_page = 50
    actions = ("retry_runs", "cancel_runs", "signal_runs")
    change_form_template = "admin/durable/durablerun/change_form.html"
    fields = ("id", "workflow", "namespace", "status_display", "tags_display", "priority", "parent_link",
              "parent_seq", "turns", "recovery_attempts", "wake_pending", "wake_at_display", "locked_by",
              "locked_until_display", "created_display", "started_display", "updated_display", "ended_display",
              "duration_display", "input_pretty", "output_pretty", "error_pretty")
    readonly_fields = fields

    def get_queryset(self, request):
        return super().get_queryset(request).defer(*selectors.PAYLOAD_COLUMNS).annotate(
            duration=ExpressionWrapper(Coalesce(F("ended_at"), Now()) - Coalesce(F("started_at"), F("created_at")),
                                       output_field=DurationField()))

    def get_object(self, request, object_id, from_field=None):
        # the change page shows the payloads: read them with the row, not one query each
        return self.scope(request, DurableRun.objects.filter(pk=object_id)).first()

    def get_search_results(self, request, queryset, search_term):
        term = search_term.strip()
        if not term:
            return queryset, False
        # One id set, each part index-served: a run id prefix (an exact id is its own prefix; LIKE 'x%' goes
        # through the varchar_pattern_ops index Django creates for a CharField primary key,
        # durable_durablerun_id_<hash>_like, since the primary key's btree cannot serve LIKE under this
        # database's C.UTF-8 collation), an attribute value, or key=value. A UNION of ids lets Postgres join
        # it to the runs by primary key; OR-ing the parts on the runs table would scan every run.
        attributes = Q(value=term)
        key, sep, value = term.partition("=")
        if sep and key.strip():
            attributes |= Q(key=key.strip(), value=value.strip())
        ids = DurableRun.objects.filter(pk__startswith=term).values("pk").union(
            RunAttribute.objects.filter(attributes).values("run_id"))
        return queryset.filter(pk__in=ids), False

    @admin.display(description="workflow", ordering="workflow")
    def workflow_name(self, run):
        # a dotted name may break after its dots ("evolution.<wbr>generation"), never inside a word
        return format_html_join(mark_safe("<wbr>"), "{}", ((part,) for part in re.split(r"(?<=\.)", run.workflow)))

    @admin.display(description="status", ordering="status")
    def status_display(self, run):
        return status_badge(run.status, run.get_status_display())

    @admin.display(description="created", ordering="created_at")
    def created(self, run):
        return format_html('{}<br><small class="durable-age">{}</small>', moment(run.created_at),
                           ago(run.created_at))

    @admin.display(description="duration", ordering="duration")
    def duration_display(self, run):
        start = run.started_at or run.created_at
        if run.ended_at is not None:
            return seconds_text((run.ended_at - start).total_seconds())
        if run.status == DurableRun.Status.PENDING and run.started_at is None:
            return "-"
        return f"{seconds_text((timezone.now() - start).total_seconds())} so far"

    @admin.display(description="recoveries", ordering="recovery_attempts")
    def recoveries(self, run):
        return run.recovery_attempts

    # ------------------------------------------------------------------------- change page

    @admin.display(description="parent")
    def parent_link(self, run):
        if not run.parent_id:
            return "-"
        url = reverse("admin:durable_durablerun_change", args=[quote(run.parent_id)])
        return format_html('<a href="{}">{}</a>', url, run.parent_id)

    @admin.display(description="tags")
    def tags_display(self, run):
        if not run.tags:
            return "-"
        return format_html_join(" ", '<a class="durable-tag" href="{}?tag={}&amp;children=show">{}</a>',
                                ((CHANGELIST, quote_param(tag), tag) for tag in run.tags))

    def _moment(field: str, description: str):  # pyright: ignore[reportSelfClsParameterName]: run in the class body, it makes methods
        @admin.display(description=description, ordering=field)
        def show(self, run):
            value = getattr(run, field)
            return moment(value) if value is None else format_html('{} <small class="durable-age">({})</small>',
                                                                   moment(value), ago(value))
        return show

    created_display = _moment("created_at", "created at")
    started_display = _moment("started_at", "started at")
    updated_display = _moment("updated_at", "updated at")
    ended_display = _moment("ended_at", "ended at")
    wake_at_display = _moment("wake_at", "wake at")
    locked_until_display = _moment("locked_until", "locked until")
    del _moment

    @admin.display(description="input")
    def input_pretty(self, run):
        return payload_html(run.input, column="run.input", row=run.id)

    @admin.display(description="output")
    def output_pretty(self, run):
        return payload_html(run.output, column="run.output", row=run.id)

    @admin.display(description="error")
    def error_pretty(self, run):
        if not run.error:
            return "-"
        try:
            return error_html(decode_strict(run.error))
        except Undecodable:
            decode(run.error, column="run.error", row=run.id)
            return error_html(None, undecodable=True)

    def change_view(self, request, object_id, form_url="", extra_context=None):
        run_id = unquote(object_id)
        run = self.get_queryset(request).filter(pk=run_id).only(
            "id", "status", "fence", "epoch", "turns", "recovery_attempts", "created_at", "started_at",
            "ended_at").first()
        if run is None:
            raise Http404(f"No durable run {run_id!r} in the workspaces you can see.")
        extra_context = {**self.run_page_context(request, run), **(extra_context or {})}
        return super().change_view(request, object_id, form_url, extra_context=extra_context)

    def run_page_context(self, request, run: DurableRun) -> dict:
        """Everything the run page draws besides the run's own fields; a fixed number of queries however many
        checkpoints, children or log entries the run has."""
        try:
            entries = selectors.run_timeline(run.id, include_payloads=True, limit=TIMELINE_LIMIT + 1)
        except RunNotFound:
            entries = []
        for entry in entries:
            entry.output_text = UNDECODABLE if "output" in entry.undecodable else (  # pyright: ignore[reportAttributeAccessIssue]: the page's text, on the entry it draws
                pretty_json(entry.output) if entry.output is not None else "")
            entry.error_html = (  # pyright: ignore[reportAttributeAccessIssue]: the page's text, on the entry it draws
                error_html(entry.error, undecodable="error" in entry.undecodable)
                if entry.error is not None or "error" in entry.undecodable else "")
        children = list(self.scope(request, DurableRun.objects.filter(parent_id=run.id)).order_by("created_at", "id")
                        .values_list("id", "workflow", "status")[:CHILDREN_LIMIT + 1])
        attributes = [(key, shown, f"{CHANGELIST}?attr={quote_param(f'{key}:eq:{shown}')}&children=show")
                      for key, shown in ((key, selectors.attribute_value(value, number)) for key, value, number in
                                         RunAttribute.objects.filter(run_id=run.id).order_by("key")
                                         .values_list("key", "value", "value_num"))]
        show_all = request.GET.get("gantt") == "all"
        try:
            rows, more = selectors.run_gantt(run.id, limit=GANTT_ALL_ROWS if show_all else GANTT_ROWS)
        except RunNotFound:
            rows, more = [], False
        active = run.status in DurableRun.Status.ACTIVE
        gantt, span = gantt_svg(rows, origin=run.started_at or run.created_at, finish=run.ended_at,
                                active=active) if rows else ("", "")
        can_act = self.has_act_permission(request)
        urls = {name: reverse(f"admin:durable_durablerun_{name}", args=[quote(run.id)])
                for name in ("retry", "cancel", "signal")}
        return {
            "timeline": entries[:TIMELINE_LIMIT], "timeline_truncated": len(entries) > TIMELINE_LIMIT,
            "timeline_limit": TIMELINE_LIMIT,
            "children": [(child_id, workflow, status_badge(status, DurableRun.Status(status).label),
                          reverse("admin:durable_durablerun_change", args=[quote(child_id)]))
                         for child_id, workflow, status in children[:CHILDREN_LIMIT]],
            "children_truncated": len(children) > CHILDREN_LIMIT,
            "children_url": f"{CHANGELIST}?parent={quote_param(run.id)}",
            "attributes": attributes,
            "gantt": gantt, "gantt_span": span, "gantt_more": more, "gantt_rows": len(rows),
            "gantt_all_url": "?gantt=all#durable-gantt-module", "gantt_limit": GANTT_ROWS,
            "driven": driven_rows(run.id),
            "history": run_history(run, entries),
            "admin_log": admin_log(run.id),
            "can_act": can_act,
            "can_retry": can_act and run.status in DurableRun.Status.RETRYABLE,
            "can_cancel": can_act and active, "can_signal": can_act and active,
            "action_urls": urls,
            "signal_form": SignalForm(),
        }

    # ---------------------------------------------------------------------------- page buttons

    def get_urls(self):
        info = f"{self.opts.app_label}_{self.opts.model_name}"
        return [
            path("<path:object_id>/retry/", self.admin_site.admin_view(self.retry_view), name=f"{info}_retry"),
            path("<path:object_id>/cancel/", self.admin_site.admin_view(self.cancel_view), name=f"{info}_cancel"),
            path("<path:object_id>/signal/", self.admin_site.admin_view(self.signal_view), name=f"{info}_signal"),
            *super().get_urls(),
        ]

    def _run_acted_on(self, request, object_id) -> DurableRun:
        """The run a button's POST acts on: 405 for another method, 404 for a run missing or of another
        workspace (as its page), 403 without the permission the list's actions need."""
        if request.method != "POST":
            raise _NotAllowed
        run = self.get_object(request, unquote(object_id))
        if run is None:
            raise Http404(f"No durable run {unquote(object_id)!r} in the workspaces you can see.")
        if not self.has_act_permission(request):
            raise PermissionDenied
        return run

    def retry_view(self, request, object_id):
        try:
            run = self._run_acted_on(request, object_id)
        except _NotAllowed:
            return HttpResponseNotAllowed(["POST"])
        ended = self._retry_logged(request, run.id, how="Retried")
        if ended is not None:
            self.message_user(request, f"Retried run {run.id}: it resumes from its last completed step "
                                       f"(the attempt it ended: {ended}).", messages.SUCCESS)
        else:
            run.refresh_from_db(fields=["status"])
            self.message_user(request, f"Run {run.id} was not retried: it is {run.status} (only failed, cancelled "
                                       "or dead runs are retried).", messages.ERROR)
        return self._change_page(run)

    def _retry_logged(self, request, run_id: str, *, how: str) -> str | None:
        """Retry a run and log the end of the attempt it ends, in one transaction: the error the retry erases
        is read under the row's lock (a second operator's retry waits, then finds nothing to retry), and a
        crash leaves both the retry and its log entry or neither. Returns that end ("failed: <error>"), or
        None when the run was not retryable."""
        with transaction.atomic():
            row = DurableRun.objects.select_for_update().filter(pk=run_id).values_list("status", "error").first()
            if row is None or not services.run_retry(run_id=run_id):
                return None
            status, error = row
            ended = f"{status}: {error_summary(error, row=run_id)}" if error else status
            self._log(request, [(run_id, f"{how}. The attempt it ended: {ended}", error)])
        return ended

    def cancel_view(self, request, object_id):
        try:
            run = self._run_acted_on(request, object_id)
        except _NotAllowed:
            return HttpResponseNotAllowed(["POST"])
        with transaction.atomic():
            cancelled = services.run_cancel(run_id=run.id, reason=f"cancelled by {request.user} in the admin")
            if cancelled:
                self._log(request, [(run.id, "Cancelled, with its active child runs.", "")])
        if cancelled:
            self.message_user(request, f"Cancelled run {run.id} and its active child runs.", messages.SUCCESS)
        else:
            run.refresh_from_db(fields=["status"])
            self.message_user(request, f"Run {run.id} was not cancelled: it is {run.status} (only pending, running "
                                       "or suspended runs are cancelled).", messages.ERROR)
        return self._change_page(run)

    def signal_view(self, request, object_id):
        try:
            run = self._run_acted_on(request, object_id)
        except _NotAllowed:
            return HttpResponseNotAllowed(["POST"])
        form = SignalForm(request.POST)
        if not form.is_valid():
            # the page again, the form's errors on its fields (the page itself is read with a GET)
            page_request = copy.copy(request)
            page_request.method = "GET"
            return self.change_view(page_request, object_id, extra_context={"signal_form": form,
                                                                           "signal_open": True})
        name, payload = form.cleaned_data["name"], form.cleaned_data["payload"]
        try:
            with transaction.atomic():
                outcome = services.signal_send(run_id=run.id, name=name, payload=payload)
                self._log(request, [(run.id, f"Sent the signal {name!r} ({outcome}).", "")])
        except (RunNotFound, InvalidRunState) as exc:
            self.message_user(request, f"Signal {name!r} not sent: {exc}.", messages.ERROR)
            return self._change_page(run)
        done = "delivered to its waiting step" if outcome == "delivered" else \
            "buffered until the run waits for it"
        self.message_user(request, f"Signal {name!r} sent to run {run.id}: {done}.", messages.SUCCESS)
        return self._change_page(run)

    def _log(self, request, entries: list[tuple[str, str, str]]) -> None:
        """The admin's log of what an operator did to runs, one entry a run: (run id, what, the error the run
        had). A retry erases the run's error and its failed checkpoint: the log keeps it, the message first,
        the traceback after a blank line, and the run page shows it afterwards."""
        content_type = ContentType.objects.get_for_model(DurableRun, for_concrete_model=False)
        LogEntry.objects.bulk_create([
            LogEntry(user_id=request.user.pk, content_type=content_type, object_id=run_id, object_repr=run_id[:200],
                     action_flag=CHANGE, change_message=message + _traceback_of(error, row=run_id))
            for run_id, message, error in entries])

    # ------------------------------------------------------------------------------ actions

    def _eligible(self, queryset, statuses, *columns) -> tuple[list, int]:
        selected = queryset.count()
        rows = list(queryset.filter(status__in=sorted(statuses)).order_by().values_list("id", *columns)
                    [:services.BULK_LIMIT])
        return rows, selected

    @admin.action(description="Retry selected failed, cancelled or dead runs", permissions=["act"])
    def retry_runs(self, request, queryset):
        rows, selected = self._eligible(queryset, DurableRun.Status.RETRYABLE)
        retried = [run_id for (run_id,) in rows
                   if self._retry_logged(request, run_id, how="Retried (a list action)") is not None]
        self.message_user(request, f"Retried {len(retried)} of {selected} selected runs "
                                   f"(only failed, cancelled or dead runs are retried; at most "
                                   f"{services.BULK_LIMIT} at once).", messages.SUCCESS)

    @admin.action(description="Cancel selected active runs", permissions=["act"])
    def cancel_runs(self, request, queryset):
        rows, selected = self._eligible(queryset, DurableRun.Status.ACTIVE)
        result = services.runs_bulk_cancel(run_ids=[run_id for (run_id,) in rows],
                                           reason=f"cancelled by {request.user} in the admin")
        self.message_user(request, f"Cancelled {result['applied']} of {selected} selected runs "
                                   f"(only pending, running or suspended runs are cancelled; at most "
                                   f"{services.BULK_LIMIT} at once).", messages.SUCCESS)

    @admin.action(description="Send a signal to selected active runs…", permissions=["act"])
    def signal_runs(self, request, queryset):
        form = SignalForm(request.POST if "apply" in request.POST else None)
        if "apply" in request.POST and form.is_valid():
            rows, selected = self._eligible(queryset, DurableRun.Status.ACTIVE)
            outcomes = {"delivered": 0, "buffered": 0}
            for (run_id,) in rows:
                try:
                    outcomes[services.signal_send(run_id=run_id, name=form.cleaned_data["name"],
                                                  payload=form.cleaned_data["payload"])] += 1
                except (RunNotFound, InvalidRunState):
                    continue  # ended since it was selected
            self.message_user(
                request,
                f"Signal {form.cleaned_data['name']!r} sent to {sum(outcomes.values())} of {selected} selected runs "
                f"({outcomes['delivered']} delivered, {outcomes['buffered']} buffered; only active runs get "
                "signals).", messages.SUCCESS,
            )
            return None
        context = {
            **self.admin_site.each_context(request),
            "title": "Send a signal",
            "opts": self.model._meta,
            "form": form,
            "runs": list(queryset.order_by("-created_at").values_list("id", "status")[:100]),
            "selected": request.POST.getlist(admin.helpers.ACTION_CHECKBOX_NAME),
            "select_across": request.POST.get("select_across", "0"),
            "action_checkbox_name": admin.helpers.ACTION_CHECKBOX_NAME,
        }
        return TemplateResponse(request, "admin/durable/durablerun/signal.html", context)


class _NotAllowed(Exception):
    """A button's view was not POSTed to."""


CHANGELIST = reverse_lazy("admin:durable_durablerun_changelist")
CHILDREN_LIMIT = 200
LOG_TRACEBACK_CHARS = 8_000
LOG_LIMIT = 50


def quote_param(value) -> str:
    return url_quote(str(value), safe="")


def driven_rows(run_id: str) -> list[dict]:
    """The rows of other apps that point at this run: each registered owner's rows whose durable_run it is
    (a row ended, with its error, keeps a failure the run's retry erased), then any other model's foreign
    key to the runs (an ingested source); never the rows a run wrote for its children (parent_run). At most
    a few of each, one query a model."""
    found = []
    seen = set()
    for owner in owners.registered():
        model = owner.model
        seen.add(model)
        for pk, status, error in model.objects.filter(durable_run_id=run_id).order_by("pk").values_list(
                "pk", "status", "error")[:5]:
            found.append({"noun": owner.noun, "pk": pk, "status": status, "error": error,
                          "url": _admin_url(model, pk), "text": f"{owner.noun} {pk}"})
    for relation in DurableRun._meta.get_fields(include_hidden=True):
        model = relation.related_model
        if (not relation.is_relation or relation.concrete or model in seen or model._meta.app_label == "durable"
                or relation.field.name == "parent_run"):
            continue
        for row in model.objects.filter(**{relation.field.attname: run_id}).order_by("pk")[:5]:
            found.append({"noun": str(model._meta.verbose_name), "pk": row.pk, "status": "", "error": "",
                          "url": _admin_url(model, row.pk), "text": f"{model._meta.verbose_name} {row.pk}: {row}"})
    return found


def _admin_url(model, pk) -> str:
    try:
        return reverse(f"admin:{model._meta.app_label}_{model._meta.model_name}_change", args=[quote(pk)])
    except NoReverseMatch:
        return ""


def run_history(run: DurableRun, entries: list) -> dict:
    """What the engine keeps of a run's earlier attempts: how many times it was retried (the fence moves on
    with every retry and continue-as-new, the epoch with continue-as-new and a retry with new input), its
    turns and recoveries, and the steps that took more than one attempt (a step waiting for its retry
    keeps its last error). A retry erases the run's error and its failed checkpoints: the admin's log keeps
    the error of a retry made here."""
    retries = run.fence - run.epoch
    return {
        "attempt": retries + 1, "retries": retries, "histories": run.epoch + 1, "turns": run.turns,
        "recoveries": run.recovery_attempts,
        "retried_steps": [entry for entry in entries if entry.attempt > 1],
    }


def admin_log(run_id: str) -> list[dict]:
    """The admin's log of this run, newest first: who retried, cancelled or signalled it, and the error a
    retry ended (its traceback apart)."""
    content_type = ContentType.objects.get_for_model(DurableRun, for_concrete_model=False)
    rows = []
    for entry in LogEntry.objects.filter(content_type=content_type, object_id=run_id).select_related("user") \
            .order_by("-action_time")[:LOG_LIMIT]:
        action, _, trace = entry.get_change_message().partition("\n\n")
        rows.append({"when": moment(entry.action_time), "ago": ago(entry.action_time), "user": entry.user,
                     "action": action, "traceback": trace})
    return rows


def _traceback_of(error_text: str, *, row: str) -> str:
    value = decode(error_text, column="run.error", row=row) if error_text else None
    trace = value.get("traceback") if isinstance(value, dict) else None
    return f"\n\n{trace[-LOG_TRACEBACK_CHARS:]}" if isinstance(trace, str) and trace else ""


class ScheduleForm(forms.ModelForm):
    class Meta:
        model = Schedule
        fields = ("key", "workflow", "namespace", "input", "every_seconds", "cron", "timezone", "paused", "overlap",
                  "jitter_seconds", "catchup_limit", "tags")

    def clean_workflow(self):
        name = self.cleaned_data["workflow"]
        try:
            get_workflow(name)
        except UnknownWorkflow as exc:
            raise ValidationError(str(exc)) from None
        return name

    def clean(self):
        data = super().clean()
        if not self.errors:
            try:
                validate_schedule(every_seconds=data.get("every_seconds"), cron=data.get("cron") or "",
                                  timezone_name=data.get("timezone") or "UTC")
            except ValidationError as exc:
                for field, errors in exc.message_dict.items():
                    self.add_error(field if field in self.fields else None, errors)
        return data


@admin.register(Schedule)
class ScheduleAdmin(WorkspaceScopedAdmin, admin.ModelAdmin):
    namespace_field = "namespace"
    form = ScheduleForm
    list_display = ("key", "workflow", "namespace", "every_seconds", "cron", "timezone", "paused", "next_fire_at",
                    "last_fired_at", "last_run_id")
    list_filter = ("paused", "namespace")
    search_fields = ("key", "workflow")
    readonly_fields = ("next_fire_at", "last_fired_at", "last_run_id", "created_at", "updated_at")
    actions = ("pause_schedules", "resume_schedules")

    def formfield_for_dbfield(self, db_field, request, **kwargs):
        if db_field.name == "namespace" and not sees_everything(request):
            # staff who are not superusers schedule only into their own workspaces' namespaces
            return forms.ChoiceField(label="namespace", choices=[
                (workspace.namespace, f"{workspace.name} ({workspace.namespace})")
                for workspace in workspaces_for(request).order_by("name")])
        return super().formfield_for_dbfield(db_field, request, **kwargs)

    def get_readonly_fields(self, request, obj=None):
        # schedule_save updates by (namespace, key): changing either would create a second schedule
        return (*self.readonly_fields, "key", "namespace") if obj is not None else self.readonly_fields

    def save_model(self, request, obj, form, change):
        saved = _schedule_save(obj)
        obj.pk, obj.next_fire_at = saved.pk, saved.next_fire_at

    def _set_paused(self, request, queryset, paused: bool):
        changed = 0
        for schedule in queryset.filter(paused=not paused):
            schedule.paused = paused
            _schedule_save(schedule)
            changed += 1
        self.message_user(request, f"{'Paused' if paused else 'Resumed'} {changed} schedules.", messages.SUCCESS)

    @admin.action(description="Pause selected schedules")
    def pause_schedules(self, request, queryset):
        self._set_paused(request, queryset, True)

    @admin.action(description="Resume selected schedules")
    def resume_schedules(self, request, queryset):
        self._set_paused(request, queryset, False)


def _schedule_save(schedule: Schedule) -> Schedule:
    return services.schedule_save(
        key=schedule.key, workflow=schedule.workflow, namespace=schedule.namespace, input=schedule.input,
        every_seconds=schedule.every_seconds, cron=schedule.cron, timezone_name=schedule.timezone,
        paused=schedule.paused, overlap=schedule.overlap, jitter_seconds=schedule.jitter_seconds,
        catchup_limit=schedule.catchup_limit, tags=schedule.tags,
    )


@admin.register(BufferedSignal)
class BufferedSignalAdmin(WorkspaceScopedAdmin, ReadOnlyAdmin):
    namespace_field = "run__namespace"
    list_display = ("id", "run_id", "name", "created_at")
    search_fields = ("=run__id", "=name")
    fields = ("run_id", "name", "payload_pretty", "created_at")
    readonly_fields = fields
    show_full_result_count = False
    paginator = EstimatedCountPaginator

    @admin.display(description="payload")
    def payload_pretty(self, signal):
        return payload_html(signal.payload, column="signal.payload", row=str(signal.pk))


@admin.register(BufferedEvent)
class BufferedEventAdmin(WorkspaceScopedAdmin, ReadOnlyAdmin):
    namespace_field = "namespace"
    list_display = ("id", "namespace", "name", "created_at", "expires_at")
    list_filter = ("namespace",)
    search_fields = ("=name",)
    fields = ("namespace", "name", "payload_pretty", "created_at", "expires_at")
    readonly_fields = fields
    show_full_result_count = False
    paginator = EstimatedCountPaginator

    @admin.display(description="payload")
    def payload_pretty(self, event):
        return format_html('<pre class="durable-json">{}</pre>', pretty_json(event.payload))

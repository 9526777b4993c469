"""The operator console's home (`/admin/`): what needs attention over a chosen window, in a fixed number of
queries whatever the row counts.

Every section reads its model through that model's admin: rows are scoped as its list scopes them
(`WorkspaceScopedAdmin.scope`: a superuser sees every workspace, a staff member their own), a section
whose list the user may not view is left out, and each number links to that list filtered to what it
counts (the status, the workflow or model, and `created_at__gte` / `started_at__gte` the window's start),
so a click lands on the rows behind it.

Counting is done by the database (`values().annotate()`, `Trunc` for the chart's buckets); each query is
bounded by the window's start on an indexed time column or by a partial index on a status (a query's
comment names its index), and every list is sliced.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from urllib.parse import urlencode

from django.db.models import Count, F, Max, OuterRef, Q, Subquery, Sum
from django.db.models.expressions import Window
from django.db.models.functions import Left, RowNumber, Trunc, TruncDate
from django.urls import reverse
from django.utils import timezone

from config import display, home_charts

WINDOW_PARAMETER = "window"
LIST_LIMIT = 10  # rows of each table (approvals, failing workflows, spend by model or workflow, evolutions)
TREND_SERIES = 10  # workflows (and golden sets) in the eval trend
TREND_RUNS = 12  # eval runs of each trend, newest


@dataclass(frozen=True)
class WindowChoice:
    key: str
    label: str
    span: timedelta
    bucket: str  # Trunc kind of the chart's buckets
    step: timedelta


WINDOWS = {choice.key: choice for choice in (
    WindowChoice("1h", "1 h", timedelta(hours=1), "minute", timedelta(minutes=1)),
    WindowChoice("24h", "24 h", timedelta(hours=24), "hour", timedelta(hours=1)),
    WindowChoice("7d", "7 d", timedelta(days=7), "hour", timedelta(hours=1)),
    WindowChoice("30d", "30 d", timedelta(days=30), "day", timedelta(days=1)),
)}
DEFAULT_WINDOW = WINDOWS["24h"]


def window_from(value: str | None) -> tuple[WindowChoice, str]:
    """The window a `?window=` value names, and an error naming the parameter for one it does not."""
    if not value:
        return DEFAULT_WINDOW, ""
    if value in WINDOWS:
        return WINDOWS[value], ""
    return DEFAULT_WINDOW, (f"Unknown {WINDOW_PARAMETER}={value!r}: choose one of {', '.join(WINDOWS)}. "
                            f"Showing the last {DEFAULT_WINDOW.label}.")


# ------------------------------------------------------------------------------------------- records

@dataclass
class Bucket:
    start: datetime
    end: datetime
    counts: dict[str, int]


@dataclass
class StatusSeries:
    """Rows created in the window by status, per bucket and in total, with the list each number opens."""

    key: str
    title: str
    statuses: list[tuple[str, str]]  # (value, label), in drawing order
    highlighted: frozenset[str]
    buckets: list[Bucket]
    totals: dict[str, int]
    list_url: str
    time_field: str
    start: datetime
    bucket: str

    @property
    def svg(self):
        return home_charts.status_svg(self, bucket=self.bucket)

    @property
    def total(self) -> int:
        return sum(self.totals.values())

    def link(self, status: str | None = None, bucket: Bucket | None = None) -> str:
        query = {f"{self.time_field}__gte": _iso(bucket.start if bucket else self.start)}
        if bucket is not None:
            query[f"{self.time_field}__lt"] = _iso(bucket.end)
        if status:
            query["status__exact"] = status
        return f"{self.list_url}?{urlencode(query)}"

    def legend(self) -> list[dict]:
        """Every status with rows, and the highlighted ones even at 0 (a 0 failed is news too)."""
        return [{"status": value, "label": label, "count": self.totals.get(value, 0), "url": self.link(value),
                 "highlighted": value in self.highlighted}
                for value, label in self.statuses if self.totals.get(value) or value in self.highlighted]


@dataclass
class Home:
    window: WindowChoice
    windows: list[WindowChoice]
    start: datetime
    now: datetime
    series: list[StatusSeries] = field(default_factory=list)
    approvals: dict | None = None
    spend: dict | None = None
    failing: list[dict] | None = None
    trends: list[dict] | None = None
    evolutions: dict | None = None
    trend_runs: int = TREND_RUNS


def _iso(moment: datetime) -> str:
    return moment.astimezone(UTC).replace(microsecond=0).isoformat()


def _changelist(model) -> str:
    return reverse(f"admin:{model._meta.app_label}_{model._meta.model_name}_changelist")


def _change(model, pk) -> str:
    from django.contrib.admin.utils import quote

    return reverse(f"admin:{model._meta.app_label}_{model._meta.model_name}_change", args=[quote(pk)])


def _url(base: str, **query) -> str:
    return f"{base}?{urlencode(query)}"


def _rows(site, request, model):
    """The model's rows as its admin list scopes them, or None when the user may not view that list."""
    model_admin = site.get_model_admin(model)
    if not model_admin.has_view_permission(request):
        return None
    return model_admin.scope(request, model._default_manager.all())


# ------------------------------------------------------------------------------------------ sections

def _bucket_starts(window: WindowChoice, start: datetime, now: datetime) -> list[datetime]:
    """The starts of the chart's buckets, as Trunc computes them in the current time zone, and the end of the
    last one."""
    local = timezone.localtime(start)
    first = local.replace(second=0, microsecond=0)
    if window.bucket in ("hour", "day"):
        first = first.replace(minute=0)
    if window.bucket == "day":
        first = first.replace(hour=0)
    starts, moment = [], first
    while not starts or starts[-1] <= now:  # and one start past now: the last bucket's end
        starts.append(moment)
        # days advance by the calendar (midnight stays midnight across a daylight-saving change), hours and
        # minutes by the clock
        moment = (timezone.make_aware(datetime.combine(moment.date() + timedelta(days=1), moment.time()))
                  if window.bucket == "day" else timezone.localtime(moment.astimezone(UTC) + window.step))
    return starts


def status_series(rows, *, key: str, title: str, status_choices, highlighted, window: WindowChoice, start: datetime,
                  now: datetime, list_url: str, time_field: str = "created_at") -> StatusSeries:
    """One query: the rows created since `start`, counted by (bucket, status)."""
    counted = (rows.filter(**{f"{time_field}__gte": start}).annotate(bucket=Trunc(time_field, window.bucket))
               .values("bucket", "status").annotate(count=Count("pk")).order_by())
    by_bucket: dict[datetime, dict[str, int]] = {}
    totals: dict[str, int] = {}
    for row in counted:
        by_bucket.setdefault(row["bucket"], {})[row["status"]] = row["count"]
        totals[row["status"]] = totals.get(row["status"], 0) + row["count"]
    starts = _bucket_starts(window, start, now)
    buckets = [Bucket(begin, end, by_bucket.get(begin, {})) for begin, end in itertools.pairwise(starts)]
    order = sorted(status_choices, key=lambda choice: choice[0] not in highlighted)  # highlighted first, stable
    return StatusSeries(key=key, title=title, statuses=order, highlighted=frozenset(highlighted), buckets=buckets,
                        totals=totals, list_url=list_url, time_field=time_field, start=start,
                        bucket=window.bucket)


def approvals_waiting(nodes, *, now: datetime) -> dict:
    """Nodes waiting for an operator's decision, oldest first (two queries on workflows_node_waiting_idx)."""
    from workflows.models import NodeInvocation, WorkflowInvocation

    waiting = nodes.filter(status=NodeInvocation.Status.WAITING)
    rows = []
    for node in (waiting.select_related("workflow_invocation__workflow_version__workflow")
                 .only("seq", "node_id", "started_at", "workflow_invocation__id",
                       "workflow_invocation__workflow_version__dsl_hash",
                       "workflow_invocation__workflow_version__workflow__name")
                 .order_by("started_at", "pk")[:LIST_LIMIT]):
        invocation = node.workflow_invocation
        rows.append({
            "workflow": invocation.workflow_version.workflow.name, "node": node.node_id,
            "invocation_id": invocation.pk,
            "age": display.seconds((now - node.started_at).total_seconds()) if node.started_at else display.DASH,
            "url": f"{_change(WorkflowInvocation, invocation.pk)}#approval-{node.seq}",
        })
    return {"count": waiting.count(), "rows": rows,
            "list_url": _url(_changelist(NodeInvocation), status__exact=NodeInvocation.Status.WAITING)}


def spend(invocations, nodes, *, start: datetime) -> dict:
    """Cost and tokens of the window: by day and by workflow from the invocations' totals (created since
    `start`), by model from the node invocations' (started since `start`). Three queries."""
    from workflows.models import NodeInvocation, WorkflowInvocation

    sums = {"usd": Sum("usd_cost"), "input_tokens": Sum("input_tokens"), "output_tokens": Sum("output_tokens")}

    def shown(row: dict, **extra) -> dict:
        return {**row, **extra, "usd_text": display.usd(row["usd"]),
                "tokens_text": f"{row['input_tokens'] or 0:,} / {row['output_tokens'] or 0:,}"}

    recent = invocations.filter(created_at__gte=start) if invocations is not None else None
    result: dict = {"by_day": None, "by_workflow": None, "by_model": None}
    if recent is not None:
        invocation_list = _changelist(WorkflowInvocation)
        result["by_day"] = [shown(row) for row in recent.annotate(day=TruncDate("created_at")).values("day")
                            .annotate(count=Count("pk"), **sums).order_by("day")]
        result["by_workflow"] = [
            shown(row, url=_url(invocation_list, workflow=row["workflow_id"], created_at__gte=_iso(start)))
            for row in recent.values(workflow_id=F("workflow_version__workflow_id"),
                                     workflow=F("workflow_version__workflow__name"))
            .annotate(count=Count("pk"), **sums).order_by("-usd", "workflow")[:LIST_LIMIT]]
    if nodes is not None:
        node_list = _changelist(NodeInvocation)
        result["by_model"] = [
            shown(row, url=_url(node_list, model=row["model"], started_at__gte=_iso(start)))
            for row in nodes.filter(started_at__gte=start).exclude(model="").values("model")
            .annotate(calls=Sum("llm_calls"), **sums).order_by("-usd", "model")[:LIST_LIMIT]]
    return result


def failing_workflows(invocations, *, start: datetime) -> list[dict]:
    """Workflows with failed invocations in the window, most failures first, each with its newest error."""
    from workflows.models import WorkflowInvocation

    failed = Q(status=WorkflowInvocation.Status.FAILED)
    newest = (invocations.filter(failed, created_at__gte=start,
                                                workflow_version__workflow_id=OuterRef("workflow_id"))
              .order_by("-created_at", "-pk"))  # in the user's scope, as the counts are
    rows = (invocations.filter(created_at__gte=start).values(workflow_id=F("workflow_version__workflow_id"),
                                                             workflow=F("workflow_version__workflow__name"))
            .annotate(total=Count("pk"), failed=Count("pk", filter=failed),
                      last_failed_at=Max("created_at", filter=failed),
                      error=Subquery(newest.annotate(text=Left("error", 400)).values("text")[:1]),
                      error_invocation=Subquery(newest.values("pk")[:1]))
            .filter(failed__gt=0).order_by("-failed", "workflow")[:LIST_LIMIT])
    invocation_list = _changelist(WorkflowInvocation)
    return [{**row, "url": _url(invocation_list, status__exact=WorkflowInvocation.Status.FAILED,
                                workflow=row["workflow_id"], created_at__gte=_iso(start)),
             "error_url": _change(WorkflowInvocation, row["error_invocation"]) if row["error_invocation"] else ""}
            for row in rows]


def eval_trends(eval_runs) -> list[dict]:
    """Per workflow and golden set, the scores of its active version's newest completed eval runs over the
    whole set (a minibatch run is not one), oldest first. One query: a window function ranks each
    version's runs on that set (served by the eval runs' workflow_version index)."""
    from evals.models import EvalRun
    from workflows.models import WorkflowVersion

    ranked = (eval_runs.filter(status=EvalRun.Status.COMPLETED, avg_score__isnull=False,
                               workflow_version__status=WorkflowVersion.Status.ACTIVE)
              .exclude(config__has_key="item_ids")
              .annotate(rank=Window(RowNumber(), partition_by=[F("workflow_version_id"), F("golden_set_id")],
                                    order_by=[F("ended_at").desc(nulls_last=True), F("pk").desc()]))
              .filter(rank__lte=TREND_RUNS)
              .values("pk", "rank", "avg_score", "pass_rate", "ended_at", "workflow_version_id", "golden_set_id",
                      workflow=F("workflow_version__workflow__name"), set_name=F("golden_set__name"))
              .order_by("workflow", "set_name", "golden_set_id", "workflow_version_id", "rank")
              [:TREND_SERIES * TREND_RUNS])
    series: dict[tuple, dict] = {}
    run_list = _changelist(EvalRun)
    for row in ranked:
        key = (row["workflow_version_id"], row["golden_set_id"])
        if key not in series:
            if len(series) == TREND_SERIES:
                break
            series[key] = {"workflow": row["workflow"], "golden_set": row["set_name"], "runs": [],
                           "url": _url(run_list, workflow_version__id__exact=row["workflow_version_id"],
                                       golden_set=row["golden_set_id"], status__exact=EvalRun.Status.COMPLETED),
                           "version_url": _change(WorkflowVersion, row["workflow_version_id"])}
        series[key]["runs"].insert(0, row)
    for entry in series.values():
        scores = [run["avg_score"] for run in entry["runs"]]
        change = scores[-1] - scores[-2] if len(scores) > 1 else None
        entry.update(latest=display.score(scores[-1]), change=change,
                     change_text="" if change is None else f"{change:+.3f}",
                     svg=home_charts.sparkline_svg(scores, title=f"{entry['workflow']} on {entry['golden_set']}: "
                                                   + ", ".join(display.score(v) for v in scores)))
    return list(series.values())


def running_evolutions(evolution_runs) -> dict:
    """Queued, running and paused evolutions, newest first, with their best fitness (evolution_run_active_idx)."""
    from evolution.models import EvolutionRun

    active = evolution_runs.filter(status__in=EvolutionRun.ACTIVE)
    from evolution.admin import lift_text

    def generations(run) -> str:
        planned = (run.config or {}).get("generations")
        return f"{run.generations_done} / {planned}" if planned not in (None, "") else str(run.generations_done)

    rows = [{"run": run, "url": _change(EvolutionRun, run.pk), "best": display.score(run.best_fitness, 2),
             "base": display.score(run.base_fitness, 2), "lift": lift_text(run.lift),
             "generations": generations(run)} for run in
            active.select_related("workflow").only("status", "mode", "best_fitness", "base_fitness",
                                                   "generations_done", "config", "created_at", "workflow__name")
            .order_by("-created_at", "-pk")[:LIST_LIMIT]]
    return {"rows": rows, "count": active.count(),
            "list_url": _url(_changelist(EvolutionRun), status__in=",".join(EvolutionRun.ACTIVE))}


# ---------------------------------------------------------------------------------------------- page

def home_page(*, site, request, window: WindowChoice) -> Home:
    """Everything the home shows over `window`, read in the user's scope."""
    from durable.models import DurableRun
    from evals.models import EvalRun
    from evolution.models import EvolutionRun
    from workflows.models import NodeInvocation, WorkflowInvocation

    now = timezone.now()
    start = now - window.span
    home = Home(window=window, windows=list(WINDOWS.values()), start=start, now=now)
    runs = _rows(site, request, DurableRun)
    if runs is not None:
        home.series.append(status_series(
            runs, key="runs", title="Durable runs", status_choices=DurableRun.Status.choices,
            highlighted=("failed", "dead", "suspended"), window=window, start=start, now=now,
            list_url=_changelist(DurableRun)))
    invocations = _rows(site, request, WorkflowInvocation)
    if invocations is not None:
        home.series.append(status_series(
            invocations, key="invocations", title="Workflow invocations",
            status_choices=WorkflowInvocation.Status.choices,
            highlighted=("failed", "waiting"), window=window, start=start, now=now,
            list_url=_changelist(WorkflowInvocation)))
        home.failing = failing_workflows(invocations, start=start)
    nodes = _rows(site, request, NodeInvocation)
    if nodes is not None:
        home.approvals = approvals_waiting(nodes, now=now)
    if invocations is not None or nodes is not None:
        home.spend = spend(invocations, nodes, start=start)
    eval_runs = _rows(site, request, EvalRun)
    if eval_runs is not None:
        home.trends = eval_trends(eval_runs)
    evolution_runs = _rows(site, request, EvolutionRun)
    if evolution_runs is not None:
        home.evolutions = running_evolutions(evolution_runs)
    return home

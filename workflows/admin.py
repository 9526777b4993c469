"""Workflows in the admin, scoped to the staff user's workspaces (superusers see every workspace).

- Workflows: name and description editable. The list shows each one's active version and its
  invocations of the last 7 days; the change page, above the form, its newest versions (the active one
  marked), its eval score trend (server-rendered SVG, workflows/charts.py), its newest invocations and
  its cost and failure rate over the last 7 days.
- Versions: read-only history. The change page shows the version's invocation stats and latest eval,
  draws the graph (server-rendered SVG, workflows/graph.py), lists the nodes, the unresolved tools and
  the genealogy (parents and children), and shows the DSL as pretty JSON. Its own pages (diff with a
  parent, run on an input, edit as a new version) are in workflows/admin_views.py.
- Invocations: read-only. The change page shows the totals, the payloads, a link to the durable run,
  a per-node timeline and each node's messages; a node waiting for approval gets Approve / Reject
  buttons and an active invocation a Cancel button (POST views that call workflows.services).
- Node invocations, messages, context entries (their blob downloadable through the admin only) and
  the LLM call cache: read-only.
- MCP registry: servers editable, their versions and tools read-only; a user's server config keeps
  its secrets write-only (never rendered back, only "set" / "not set").

Models without a workspace column are scoped through their parent's (`workspace_field` lookups).
"""

from __future__ import annotations

import json
import re
from datetime import datetime, timedelta
from decimal import Decimal
from pathlib import PurePosixPath
from urllib.parse import quote_plus

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.options import IncorrectLookupParameters
from django.contrib.admin.utils import quote, unquote
from django.contrib.admin.views.main import SEARCH_VAR
from django.contrib.auth import get_user_model
from django.contrib.postgres.search import SearchQuery
from django.core.exceptions import PermissionDenied, ValidationError
from django.db import models
from django.db.models import (
    BooleanField,
    Count,
    DurationField,
    Exists,
    ExpressionWrapper,
    F,
    OuterRef,
    Prefetch,
    Q,
    Subquery,
)
from django.db.models.fields.json import KT
from django.db.models.functions import Coalesce
from django.http import FileResponse, Http404
from django.urls import path, reverse
from django.utils import timezone
from django.utils.dateparse import parse_datetime
from django.utils.formats import date_format
from django.utils.functional import cached_property
from django.utils.html import format_html, format_html_join

from config.admin import (
    BucketFilter,
    CreatedWithinFilter,
    EstimatedCountPaginator,
    PostActionsMixin,
    ReadOnlyAdmin,
    change_page_panels,
)
from config.display import (
    clipped,
    durable_run_link,
    excerpt,
    json_html,
    moment,
    number_field,
    percent,
    pretty_json,
    score,
    status_badge,
    usd,
)
from config.display import seconds as seconds_text
from knowledge.models import SEARCH_CONFIG
from workflows import charts, graph, selectors, services
from workflows.admin_views import VersionViews
from workflows.models import (
    ContextEntry,
    LlmCall,
    McpServer,
    McpServerVersion,
    McpTool,
    Message,
    NodeInvocation,
    NodeVersion,
    UserServerConfig,
    Workflow,
    WorkflowInvocation,
    WorkflowVersion,
    invocation_search_vector,
    message_search_vector,
)
from workflows.selectors import NodeCalls, node_calls
from workspaces.admin_scope import (
    ScopedChoiceFilter,
    WorkspaceFilter,
    WorkspaceScopedAdmin,
    full_object,
    per_request,
    sees_everything,
    workspaces_for,
)

MESSAGE_LIMIT = 2000  # messages shown on an invocation's page; the Messages admin pages through the rest
LONG_TEXT = 600  # longer texts start collapsed
CHILDREN_LIMIT = 200


def change_link(model_name: str, pk, label) -> str:
    url = reverse(f"admin:workflows_{model_name}_change", args=[quote(pk)])
    return format_html('<a href="{}">{}</a>', url, label)


# ------------------------------------------------------------------------------------------ workflows

WORKFLOW_VERSIONS_SHOWN = 50  # newest versions on a workflow's page; the version list has them all
WORKFLOW_INVOCATIONS_SHOWN = 20
TREND_RUNS = 100  # eval runs drawn in a workflow's score trend, newest
RECENT = timedelta(days=7)  # the window of a workflow's cost and failure rate
VERSION_STATS_LIMIT = 1000  # a version's stats are of its latest invocations


@admin.register(Workflow)
class WorkflowAdmin(WorkspaceScopedAdmin, admin.ModelAdmin):
    list_display = ("name", "workspace", "active_version", "invocations_recent", "owner", "created_at")
    list_filter = [("workspace", admin.RelatedOnlyFieldListFilter)]  # only workspaces the user sees
    list_select_related = ("workspace", "owner")
    search_fields = ("name", "description")
    raw_id_fields = ("owner",)
    change_form_template = "admin/workflows/workflow/change_form.html"

    def get_queryset(self, request):
        # each a subquery per listed row: the one-active-version index, and the invocations' version index
        active = WorkflowVersion.objects.filter(workflow=OuterRef("pk"), status=WorkflowVersion.Status.ACTIVE)
        recent = (WorkflowInvocation.objects.filter(workflow_version__workflow=OuterRef("pk"),
                                                    created_at__gte=timezone.now() - RECENT)
                  .order_by().values("workflow_version__workflow").annotate(count=Count("pk")).values("count"))
        return super().get_queryset(request).annotate(
            active_version_pk=Subquery(active.values("pk")[:1]), active_version_hash=Subquery(active.values(
                "dsl_hash")[:1]), invocation_count=Coalesce(Subquery(recent), 0))

    @admin.display(description="active version")
    def active_version(self, workflow):
        if workflow.active_version_pk is None:
            return "-"
        return change_link("workflowversion", workflow.active_version_pk, workflow.active_version_hash[:12])

    @admin.display(description="invocations (7 d)", ordering="invocation_count")
    def invocations_recent(self, workflow):
        return f"{workflow.invocation_count:,}"

    def render_change_form(self, request, context, add=False, change=False, form_url="", obj=None):
        if obj is not None:
            context.update(workflow_page(obj))
        return super().render_change_form(request, context, add, change, form_url, obj)


@admin.register(WorkflowVersion)
class WorkflowVersionAdmin(VersionViews, WorkspaceScopedAdmin, ReadOnlyAdmin):
    workspace_field = "workflow__workspace"
    list_display = ("short_hash", "workflow", "status", "operation", "generation", "commit_message", "avg_score_text",
                    "pass_rate_text", "created_at")
    list_filter = ("status", "operation")
    list_select_related = ("workflow",)
    search_fields = ("^dsl_hash", "workflow__name", "commit_message")
    search_help_text = "The start of a version hash, a workflow name or words of a commit message."
    ordering = ("-created_at", "-id")
    change_form_template = "admin/workflows/workflowversion/change_form.html"
    fields = ("workflow", "dsl_hash", "status", "operation", "generation", "commit_message", "unresolved",
              "avg_score_text", "pass_rate_text", "created_by", "created_at", "invocations_link")
    readonly_fields = fields
    avg_score_text = number_field("avg_score", "score", "avg score")
    pass_rate_text = number_field("pass_rate", "percent", "pass rate")

    def get_queryset(self, request):
        return super().get_queryset(request).defer("dsl", "input_schema", "output_schema")

    def get_object(self, request, object_id, from_field=None):
        return full_object(self, request, WorkflowVersion.objects.select_related("workflow", "created_by"),
                           object_id)

    @admin.display(description="version", ordering="dsl_hash")
    def short_hash(self, version):
        return version.dsl_hash[:12]

    @admin.display(description="unresolved tools")
    def unresolved(self, version):
        if not version.unresolved_tools:
            return "none"
        return format_html('<span class="wf-unresolved">{}</span>', format_html_join(
            " ", '<span class="wf-tag wf-tag-missing">{}</span>', ((name,) for name in version.unresolved_tools)))

    @admin.display(description="invocations")
    def invocations_link(self, version):
        url = reverse("admin:workflows_workflowinvocation_changelist") + f"?workflow_version__id__exact={version.pk}"
        return format_html('<a href="{}">invocations of this version</a>', url)

    def render_change_form(self, request, context, add=False, change=False, form_url="", obj=None):
        if obj is not None:
            context.update(self.version_context(request, obj))
        return super().render_change_form(request, context, add, change, form_url, obj)

    def version_context(self, request, version: WorkflowVersion) -> dict:
        summary = ("pk", "dsl_hash", "operation", "status", "commit_message", "created_at")
        parent_ids = [pk for pk in (version.parent1_id, version.parent2_id) if pk]
        parents = {row.pk: row for row in self.scope(request, WorkflowVersion.objects.filter(pk__in=parent_ids))
                   .only(*summary)} if parent_ids else {}
        children = list(self.scope(request, WorkflowVersion.objects.filter(Q(parent1=version) | Q(parent2=version)))
                        .only(*summary).order_by("created_at", "pk")[:CHILDREN_LIMIT + 1])

        def row(role, item):
            return {"role": role, "url": reverse("admin:workflows_workflowversion_change", args=[item.pk]),
                    "hash": item.dsl_hash[:12], "operation": item.get_operation_display(),
                    "status": item.get_status_display(), "message": item.commit_message}

        unresolved = set(version.unresolved_tools or [])
        nodes = []
        for node in graph.dsl_nodes(version.dsl):
            prompt = node.get("systemPrompt") or ""
            code, mcp = graph.name_list(node.get("codeTools")), graph.name_list(node.get("mcpTools"))
            nodes.append({
                "id": node["nodeId"], "entry": node["nodeId"] == version.dsl.get("entryNodeId"),
                "description": node.get("description") or "", "model": node.get("gatewayModelId") or "",
                "tools": [{"name": name, "kind": kind, "unresolved": f"{node['nodeId']}.{name}" in unresolved}
                          for kind, names in (("code", code), ("mcp", mcp)) for name in names],
                "handoffs": graph.name_list(node.get("handOffs")), "handoff_type": node.get("handOffType") or "",
                "wait_for": graph.name_list(node.get("waitFor")), "skills": graph.name_list(node.get("skills")),
                "max_steps": node.get("maxSteps"), "requires_approval": bool(node.get("requiresApproval")),
                "prompt": prompt, "prompt_excerpt": excerpt(prompt, 160), "prompt_long": len(prompt) > 160,
            })
        return {
            "graph_svg": graph.dsl_svg(version.dsl, unresolved=unresolved),
            "graph_nodes": nodes,
            "parents": [row(f"parent {index}", parents[pk]) for index, pk in
                        ((1, version.parent1_id), (2, version.parent2_id)) if pk in parents],
            "children": [row("child", child) for child in children[:CHILDREN_LIMIT]],
            "children_truncated": len(children) > CHILDREN_LIMIT,
            "children_limit": CHILDREN_LIMIT,
            "dsl_text": pretty_json(version.dsl),
            "stats": version_stats(version),
            **self.version_links(request, version),
        }


def invocation_stats_view(stats: selectors.InvocationStats) -> dict:
    return {"total": f"{stats.total:,}", "ended": f"{stats.ended:,}", "failed": f"{stats.failed:,}",
            "failure_rate": percent(stats.failure_rate), "usd_cost": usd(stats.usd_cost),
            "avg_usd_cost": usd(stats.avg_usd_cost), "avg_duration": seconds_text(stats.avg_seconds)}


def invocation_duration(invocation) -> str:
    if invocation.started_at is None:
        return "-"
    if invocation.ended_at is None:
        return f"{seconds_text((timezone.now() - invocation.started_at).total_seconds())} so far"
    return seconds_text((invocation.ended_at - invocation.started_at).total_seconds())


def workflow_page(workflow: Workflow) -> dict:
    """What a workflow's change page shows above its form: its newest versions, its score trend, its newest
    invocations and its last 7 days (four queries whatever the rows)."""
    since = timezone.now() - RECENT
    versions = selectors.workflow_versions_recent(workflow_id=workflow.pk, limit=WORKFLOW_VERSIONS_SHOWN + 1)
    invocations = selectors.workflow_invocations_recent(workflow=workflow, limit=WORKFLOW_INVOCATIONS_SHOWN)
    runs = selectors.workflow_eval_scores(workflow=workflow, limit=TREND_RUNS)
    invocation_list = reverse("admin:workflows_workflowinvocation_changelist")
    window = f"workflow={workflow.pk}&created_at__gte={quote_plus(since.isoformat())}"
    return {
        "versions": [{
            "url": reverse("admin:workflows_workflowversion_change", args=[version.pk]),
            "hash": version.dsl_hash[:12], "operation": version.get_operation_display(),
            "status": version.status, "status_label": version.get_status_display(),
            "active": version.status == WorkflowVersion.Status.ACTIVE, "generation": version.generation,
            "avg_score": score(version.avg_score), "pass_rate": percent(version.pass_rate),
            "created_at": moment(version.created_at), "message": excerpt(version.commit_message, 120),
        } for version in versions[:WORKFLOW_VERSIONS_SHOWN]],
        "versions_truncated": len(versions) > WORKFLOW_VERSIONS_SHOWN,
        "versions_shown": WORKFLOW_VERSIONS_SHOWN,
        "versions_url": reverse("admin:workflows_workflowversion_changelist") + f"?workflow__id__exact={workflow.pk}",
        "invocations": [{
            "id": invocation.pk, "url": reverse("admin:workflows_workflowinvocation_change", args=[invocation.pk]),
            "version": invocation.version_hash[:12],
            "version_url": reverse("admin:workflows_workflowversion_change", args=[invocation.workflow_version_id]),
            "status": status_badge(invocation.status, invocation.get_status_display()),
            "cost": usd(invocation.usd_cost), "duration": invocation_duration(invocation),
            "created_at": moment(invocation.created_at),
        } for invocation in invocations],
        "invocations_url": f"{invocation_list}?workflow={workflow.pk}",
        "recent": invocation_stats_view(selectors.workflow_invocation_stats(workflow=workflow, since=since)),
        "recent_url": f"{invocation_list}?{window}",
        "recent_failed_url": f"{invocation_list}?{window}&status__exact={WorkflowInvocation.Status.FAILED}",
        "trend_svg": charts.score_trend_svg(runs, title=f"Eval scores of {workflow.name}'s versions"),
        "trend_runs": len(runs), "trend_limit": TREND_RUNS,
    }


def version_stats(version: WorkflowVersion) -> dict:
    """A version's invocation totals (of its latest VERSION_STATS_LIMIT) and its latest eval (two queries)."""
    stats = selectors.version_invocation_stats(version_id=version.pk, limit=VERSION_STATS_LIMIT)
    latest = selectors.version_latest_eval(version_id=version.pk)
    return {**invocation_stats_view(stats), "capped": stats.total >= VERSION_STATS_LIMIT,
            "limit": f"{VERSION_STATS_LIMIT:,}",
            "eval": {**latest, "score": score(latest["avg_score"]), "pass_rate": percent(latest["pass_rate"]),
                     "at": moment(latest["at"]), "url": reverse("admin:evals_evalrun_change", args=[latest["pk"]])}
            if latest else None}


# ---------------------------------------------------------------------------------------- invocations

class WorkflowFilter(ScopedChoiceFilter):
    title, parameter_name, field = "workflow", "workflow", "workflow_version__workflow_id"

    def options(self, request):
        return Workflow.objects.filter(workspace__in=workspaces_for(request)).order_by("name", "pk") \
            .values_list("pk", "name")


class CostFilter(BucketFilter):
    title, parameter_name = "cost", "cost"
    buckets = {
        "free": ("$0 (free or cached)", lambda: Q(usd_cost=0)),
        "0.01": ("> $0.01", lambda: Q(usd_cost__gt=Decimal("0.01"))),
        "0.10": ("> $0.10", lambda: Q(usd_cost__gt=Decimal("0.10"))),
        "1": ("> $1", lambda: Q(usd_cost__gt=Decimal("1"))),
    }


class LatencyFilter(BucketFilter):
    """Ended invocations by how long they ran (`duration`, annotated by the admin's queryset)."""

    title, parameter_name = "duration", "duration"
    buckets = {
        "1s": ("under 1 s", lambda: Q(duration__lt=timedelta(seconds=1))),
        "10s": ("1 s - 10 s", lambda: Q(duration__gte=timedelta(seconds=1), duration__lt=timedelta(seconds=10))),
        "1m": ("10 s - 1 min", lambda: Q(duration__gte=timedelta(seconds=10), duration__lt=timedelta(minutes=1))),
        "10m": ("1 min - 10 min", lambda: Q(duration__gte=timedelta(minutes=1), duration__lt=timedelta(minutes=10))),
        "long": ("10 min or more", lambda: Q(duration__gte=timedelta(minutes=10))),
    }


class NameFilter(admin.SimpleListFilter):
    """A filter on a name the invocation used (a model, a tool), its choices the names of the user's workspaces
    (`names(request)`, read once a request); `match(name)` is the Q of the invocations that used it. No facet
    counts: each would search every listed invocation's nodes or messages once per name."""

    limit = 200

    def names(self, request) -> list[str]:
        raise NotImplementedError

    def match(self, name: str) -> Q:
        raise NotImplementedError

    def lookups(self, request, model_admin):
        key = f"names:{type(self).__qualname__}"
        return [(name, name) for name in per_request(request, key, lambda: self.names(request))[:self.limit]]

    def queryset(self, request, queryset):
        if not self.value():
            return queryset
        if "\x00" in self.value():  # Postgres text holds no NUL: the query would fail
            raise IncorrectLookupParameters(f"{self.parameter_name}: not a name")
        return queryset.filter(self.match(self.value()))

    def get_facet_counts(self, pk_attname, filtered_qs):
        return {}


class ModelFilter(NameFilter):
    """A model a node of the invocation is written for (its version's DSL) or was answered by (its calls)."""

    title, parameter_name = "model", "model"
    RECENT_NODES = 1000  # the answering models are read from this many latest node invocations

    def names(self, request):
        workspaces = workspaces_for(request)
        configured = NodeVersion.objects.filter(workflow_version__workflow__workspace__in=workspaces) \
            .order_by().values_list("llm_model", flat=True).distinct()[:self.limit]
        answered = NodeInvocation.objects.filter(workflow_invocation__workspace__in=workspaces).exclude(model="") \
            .order_by("-started_at").values_list("model", flat=True)[:self.RECENT_NODES]
        return sorted({*configured, *answered})

    def match(self, name):
        return Q(Exists(NodeInvocation.objects.filter(workflow_invocation=OuterRef("pk"), model=name))) | Q(
            workflow_version__in=NodeVersion.objects.filter(llm_model=name).values("workflow_version"))


class ToolFilter(NameFilter):
    """A tool the invocation called (its tool results: the partial index workflows_msg_tool_idx serves it)."""

    title, parameter_name = "tool", "tool"

    def names(self, request):
        lists = NodeVersion.objects.filter(workflow_version__workflow__workspace__in=workspaces_for(request)) \
            .exclude(tools=[]).order_by().values_list("tools", flat=True).distinct()[:self.limit]
        return sorted({tool["name"] for tools in lists if isinstance(tools, list) for tool in tools
                       if isinstance(tool, dict) and isinstance(tool.get("name"), str)})

    def match(self, name):
        return Q(pk__in=Message.objects.filter(role=Message.Role.TOOL).alias(tool=KT("payload__name"))
                 .filter(tool=name).values("workflow_invocation_id"))


class SearchedCountPaginator(EstimatedCountPaginator):
    """A searched list counts its first `limit` matches only: a common word can match most of a big table, and
    an exact count would read every match; the pages past the limit are not offered."""

    limit = 1000

    @cached_property
    def count(self):
        return self.object_list[:self.limit].count()


class DecisionForm(forms.Form):
    node_seq = forms.IntegerField(min_value=1)
    decision = forms.ChoiceField(choices=[("approve", "Approve"), ("reject", "Reject"), ("revise", "Revise")])
    comment = forms.CharField(required=False, max_length=10_000, widget=forms.Textarea(attrs={"rows": 2}))


@admin.register(WorkflowInvocation)
class WorkflowInvocationAdmin(PostActionsMixin, WorkspaceScopedAdmin, ReadOnlyAdmin):
    list_display = ("id", "workflow_name", "version_link", "status_display", "cost", "tokens", "node_count",
                    "created", "duration_display")
    list_display_links = ("id",)
    list_filter = ("status", WorkflowFilter, ModelFilter, ToolFilter, CostFilter, LatencyFilter, CreatedWithinFilter,
                   WorkspaceFilter)
    list_select_related = ("workflow_version__workflow",)
    search_fields = ("id",)  # see get_search_results
    search_help_text = (f"Words said in an invocation (its messages, input or output; web search syntax: \"a phrase\", "
                        f"or, -word), an invocation id, a durable run id, the start of a version hash, or a workflow "
                        f"name; at most {SearchedCountPaginator.limit:,} matches are listed, newest first.")
    ordering = ("-created_at", "-id")
    show_full_result_count = False
    paginator = EstimatedCountPaginator
    list_per_page = 50
    actions = ("cancel_invocations",)
    change_form_template = "admin/workflows/workflowinvocation/change_form.html"
    fieldsets = (
        (None, {"fields": ("workspace", "version_link", "status_display", "created_by", "created_at", "started_at",
                           "ended_at", "duration_display", "run_link")}),
        ("Totals", {"fields": ("cost_display", "tokens", "llm_calls_display", "nodes_display", "fitness_score")}),
        ("Payloads", {"fields": ("input_pretty", "output_pretty", "error_pretty")}),
    )
    readonly_fields = ("workspace", "version_link", "status_display", "created_by", "created_at", "started_at",
                       "ended_at", "duration_display", "run_link", "cost_display", "tokens", "llm_calls_display",
                       "nodes_display", "fitness_score", "input_pretty", "output_pretty", "error_pretty")

    def get_queryset(self, request):
        return super().get_queryset(request).select_related("workflow_version__workflow").defer(
            "input", "output", "error", "workflow_version__dsl",
                                                   "workflow_version__input_schema",
                                                   "workflow_version__output_schema").annotate(
            duration=ExpressionWrapper(F("ended_at") - F("started_at"), output_field=DurationField()))

    def get_object(self, request, object_id, from_field=None):
        queryset = WorkflowInvocation.objects.select_related("workflow_version__workflow", "workspace", "created_by") \
            .defer("workflow_version__dsl", "workflow_version__input_schema", "workflow_version__output_schema")
        return full_object(self, request, queryset, object_id)

    def get_search_results(self, request, queryset, search_term):
        term = search_term.strip()
        if not term:
            return queryset, False
        match = Q(durable_run_id=term) | Q(workflow_version__workflow__name__icontains=term)
        if term.isdigit() and term.isascii():
            match |= Q(pk=int(term))
        if re.fullmatch(r"[0-9a-fA-F]{6,64}", term):
            match |= Q(workflow_version__dsl_hash__startswith=term.lower())
        # words: each side read through its GIN index (the same expressions), into a set of ids probed per row
        words = SearchQuery(term[:1000], config=SEARCH_CONFIG, search_type="websearch")
        said = Message.objects.alias(words=message_search_vector()).filter(words=words)
        own = WorkflowInvocation.objects.alias(words=invocation_search_vector()).filter(words=words)
        match |= Q(pk__in=said.values("workflow_invocation_id")) | Q(pk__in=own.values("pk"))
        return queryset.filter(match), False

    def get_paginator(self, request, queryset, per_page, orphans=0, allow_empty_first_page=True):
        paginator = SearchedCountPaginator if request.GET.get(SEARCH_VAR, "").strip() else self.paginator
        return paginator(queryset, per_page, orphans, allow_empty_first_page)

    # ------------------------------------------------------------------------------ columns and fields

    @admin.display(description="created", ordering="created_at")
    def created(self, invocation):
        return date_format(timezone.localtime(invocation.created_at), "Y-m-d H:i:s")

    @admin.display(description="workflow", ordering="workflow_version__workflow__name")
    def workflow_name(self, invocation):
        return invocation.workflow_version.workflow.name

    @admin.display(description="version")
    def version_link(self, invocation):
        return change_link("workflowversion", invocation.workflow_version_id, invocation.workflow_version.dsl_hash[:12])

    @admin.display(description="status", ordering="status")
    def status_display(self, invocation):
        return status_badge(invocation.status, invocation.get_status_display())

    @admin.display(description="cost", ordering="usd_cost")
    def cost(self, invocation):
        return usd(invocation.usd_cost)

    @admin.display(description="tokens (in / out)", ordering="input_tokens")
    def tokens(self, invocation):
        return f"{invocation.input_tokens:,} / {invocation.output_tokens:,}"

    @admin.display(description="cost")
    def cost_display(self, invocation):
        return f"{usd(invocation.usd_cost)} (budget {usd(invocation.usd_budget)})"

    @admin.display(description="LLM calls")
    def llm_calls_display(self, invocation):
        return f"{invocation.llm_calls:,} ({invocation.cache_hits:,} answered by the cache)"

    @admin.display(description="node invocations")
    def nodes_display(self, invocation):
        return f"{invocation.node_count:,} (budget {invocation.node_budget:,})"

    @admin.display(description="duration", ordering="duration")
    def duration_display(self, invocation):
        if invocation.started_at is None:
            return "-"
        if invocation.ended_at is None:
            return f"{seconds_text((timezone.now() - invocation.started_at).total_seconds())} so far"
        return seconds_text((invocation.ended_at - invocation.started_at).total_seconds())

    @admin.display(description="durable run")
    def run_link(self, invocation):
        return durable_run_link(invocation.durable_run_id)

    @admin.display(description="input")
    def input_pretty(self, invocation):
        return json_html(invocation.input)

    @admin.display(description="output")
    def output_pretty(self, invocation):
        return json_html(invocation.output)

    @admin.display(description="error")
    def error_pretty(self, invocation):
        return format_html('<pre class="wf-json wf-error">{}</pre>', invocation.error) if invocation.error else "-"

    # ------------------------------------------------------------------------------------ change page

    def render_change_form(self, request, context, add=False, change=False, form_url="", obj=None):
        if obj is not None:
            context.update(self.invocation_context(request, obj))
            version = obj.workflow_version
            context["subtitle"] = f"Invocation {obj.pk} of {version.workflow.name} @ {version.dsl_hash[:12]}"
        return super().render_change_form(request, context, add, change, form_url, obj)

    def invocation_context(self, request, invocation: WorkflowInvocation) -> dict:
        nodes = list(NodeInvocation.objects.filter(workflow_invocation=invocation).order_by("seq"))
        rows = list(Message.objects.filter(workflow_invocation=invocation).order_by("seq")[:MESSAGE_LIMIT + 1])
        entries = list(ContextEntry.objects.filter(workflow_invocation=invocation).order_by("created_at", "pk")
                       .defer("metadata"))
        by_node: dict[int | None, list[dict]] = {}
        raw_by_node: dict[int | None, list[Message]] = {}
        for message in rows[:MESSAGE_LIMIT]:
            by_node.setdefault(message.node_invocation_id, []).append(message_view(message))
            raw_by_node.setdefault(message.node_invocation_id, []).append(message)
        seq_of = {node.pk: node.seq for node in nodes}
        can_act = self.has_act_permission(request)
        calls = node_calls(invocation_id=invocation.pk)
        chart = timeline(invocation, nodes)
        return {
            "timeline": chart,
            "span_tree": [{"seq": node.seq, "node_id": node.node_id, "bar": bar,
                           "spans": node_spans(node, raw_by_node.get(node.pk, []), chart)}
                          for node, bar in zip(nodes, chart["bars"], strict=True)],
            "panels": change_page_panels.for_object(request, invocation),
            "node_views": [node_view(node, by_node.get(node.pk, []), can_act, calls.get(node.pk)) for node in nodes],
            "loose_messages": by_node.get(None, []),
            "messages_truncated": len(rows) > MESSAGE_LIMIT,
            "message_limit": MESSAGE_LIMIT,
            "messages_url": reverse("admin:workflows_message_changelist") + f"?q={invocation.pk}",
            "context_entries": [{
                "key": entry.key, "scope": entry.get_scope_display(), "size": entry.size,
                "content_type": entry.content_type, "summary": excerpt(entry.summary, 200),
                "node_seq": seq_of.get(entry.node_invocation_id),
                "url": reverse("admin:workflows_contextentry_change", args=[entry.pk]),
                "download_url": reverse("admin:workflows_contextentry_download", args=[entry.pk]),
            } for entry in entries],
            "can_act": can_act,
            "can_cancel": can_act and invocation.status not in WorkflowInvocation.TERMINAL,
            "cancel_url": reverse("admin:workflows_workflowinvocation_cancel", args=[quote(invocation.pk)]),
            "decide_url": reverse("admin:workflows_workflowinvocation_decide", args=[quote(invocation.pk)]),
        }

    # ---------------------------------------------------------------------------------------- actions

    def get_urls(self):
        info = f"{self.opts.app_label}_{self.opts.model_name}"
        return [
            path("<path:object_id>/decide/", self.admin_site.admin_view(self.decide_view),
                 name=f"{info}_decide"),
            path("<path:object_id>/cancel/", self.admin_site.admin_view(self.cancel_view),
                 name=f"{info}_cancel"),
            *super().get_urls(),
        ]

    def _back(self, invocation, anchor: str = ""):
        return self._change_page(invocation, anchor)

    def decide_view(self, request, object_id):
        invocation, refused = self._acting_on(request, object_id)
        if refused is not None:
            return refused
        form = DecisionForm(request.POST)
        if not form.is_valid():
            errors = "; ".join(f"{field}: {' '.join(problems)}" for field, problems in form.errors.items())
            self.message_user(request, f"Not recorded: {errors}", messages.ERROR)
            return self._back(invocation)
        data = form.cleaned_data
        try:
            node = services.invocation_decide(invocation=invocation, decision=data["decision"],
                                              comment=data["comment"], user=request.user, node_seq=data["node_seq"])
        except (services.InvalidInvocationState, services.InvocationRefused) as exc:
            self.message_user(request, f"Not recorded: {exc}", messages.ERROR)
            return self._back(invocation, f"node-{data['node_seq']}")
        if data["decision"] == "revise":
            self.message_user(request, f"Asked node {node.node_id} (#{node.seq}) of invocation {invocation.pk} for a "
                                       "revision; the model answers your comment and the node waits for a decision "
                                       "again.", messages.SUCCESS)
            return self._back(invocation, f"node-{node.seq}")
        verb = "Approved" if data["decision"] == "approve" else "Rejected"
        self.message_user(request, f"{verb} node {node.node_id} (#{node.seq}) of invocation {invocation.pk}; "
                                   "the run goes on with the decision.", messages.SUCCESS)
        return self._back(invocation, f"node-{node.seq}")

    def cancel_view(self, request, object_id):
        invocation, refused = self._acting_on(request, object_id)
        if refused is not None:
            return refused
        if services.invocation_cancel(invocation=invocation, reason=f"cancelled by {request.user} in the admin"):
            self.message_user(request, f"Cancelled invocation {invocation.pk}.", messages.SUCCESS)
        else:
            self.message_user(request, f"Invocation {invocation.pk} was not cancelled: it is {invocation.status} "
                                       "(only queued, running or waiting invocations with an active run are "
                                       "cancelled).", messages.ERROR)
        return self._back(invocation)

    def has_cancel_permission(self, request):
        return self.has_act_permission(request)

    @admin.action(description="Cancel selected queued, running or waiting invocations", permissions=["cancel"])
    def cancel_invocations(self, request, queryset):
        selected = queryset.count()
        eligible = queryset.exclude(status__in=WorkflowInvocation.TERMINAL).order_by("pk")[:500]
        cancelled = sum(1 for invocation in eligible
                        if services.invocation_cancel(invocation=invocation,
                                                      reason=f"cancelled by {request.user} in the admin"))
        self.message_user(request, f"Cancelled {cancelled} of {selected} selected invocations (only queued, running "
                                   "or waiting ones are cancelled; at most 500 at once).", messages.SUCCESS)


def timeline(invocation: WorkflowInvocation, nodes: list[NodeInvocation]) -> dict:
    """Bars for the node invocations, positioned (in % of the invocation's span) by their start and
    end relative to the invocation's start; a node still running ends now."""
    now = timezone.now()
    active = invocation.status not in WorkflowInvocation.TERMINAL
    starts = [node.started_at for node in nodes if node.started_at]
    ends = [node.ended_at for node in nodes if node.ended_at]
    origin = invocation.started_at or (min(starts) if starts else None) or invocation.created_at
    finish = invocation.ended_at or max([*ends, *starts, origin])
    if active:
        finish = max(finish, now)
    total = max((finish - origin).total_seconds(), 0.001)
    bars = []
    for node in nodes:
        start = node.started_at or origin
        end = node.ended_at or (now if active and node.status in (NodeInvocation.Status.RUNNING,
                                                                   NodeInvocation.Status.WAITING) else start)
        left = min(max((start - origin).total_seconds() / total * 100, 0), 100)
        width = min(max((end - start).total_seconds() / total * 100, 0.4), 100 - left if left < 100 else 0.4)
        bars.append({
            "seq": node.seq, "node_id": node.node_id, "status": "throttled" if node.throttled else node.status,
            "label": f"Throttled: {node.throttle_reason}" if node.throttled else node.get_status_display(),
            "left": f"{left:.3f}", "width": f"{width:.3f}", "open": node.ended_at is None,
            "offset": seconds_text((start - origin).total_seconds()) if node.started_at else "-",
            "duration": seconds_text((end - start).total_seconds()) if node.started_at else "-",
        })
    ticks = [{"left": f"{fraction * 100:.0f}", "label": seconds_text(total * fraction)}
             for fraction in (0, 0.25, 0.5, 0.75, 1)]
    return {"bars": bars, "ticks": ticks, "total": seconds_text(total), "origin": origin, "seconds": total}


def _placed(chart: dict, start: datetime, end: datetime) -> dict:
    """A span's offset and duration from the invocation's start, and its bar in % of the timeline's span."""
    total = chart["seconds"]
    offset = (start - chart["origin"]).total_seconds()
    length = max((end - start).total_seconds(), 0)
    left = min(max(offset / total * 100, 0), 100)
    return {"offset": seconds_text(max(offset, 0)), "duration": seconds_text(length), "left": f"{left:.3f}",
            "width": f"{min(max(length / total * 100, 0.4), max(100 - left, 0.4)):.3f}"}


def _latency(payload: dict) -> timedelta | None:
    value = payload.get("latency_ms")
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < 1e10:
        return None
    return timedelta(milliseconds=value)


def node_spans(node: NodeInvocation, rows: list[Message], chart: dict) -> list[dict]:
    """A node's spans, as a tree: its model calls in order (model, tokens, cost, duration, cached), each with the
    tool calls of its round below it, and a revision an operator asked for where it opened. A message is written
    as its call ends (`created_at`), so a call started its recorded latency earlier; one recorded without a
    latency started where the message before it ended."""
    spans: list[dict] = []
    previous = node.started_at or chart["origin"]
    for message in rows:
        payload = message.payload if isinstance(message.payload, dict) else {}
        end = message.created_at
        latency = _latency(payload)
        start = max(end - latency, chart["origin"]) if latency is not None else min(previous, end)
        if message.role == Message.Role.ASSISTANT:
            usage = payload.get("usage") if isinstance(payload.get("usage"), dict) else {}
            cached = bool(payload.get("cache_hit"))
            try:
                cost = usd(usage.get("usd_cost") or 0) if not cached else "$0.00"
            except (ArithmeticError, ValueError, TypeError):
                cost = "-"
            purpose = _text(payload.get("purpose"))
            spans.append({"kind": "llm", "seq": message.seq, "model": _text(payload.get("model") or usage.get("model")),
                          "input_tokens": usage.get("input_tokens", 0), "output_tokens": usage.get("output_tokens", 0),
                          "cost": cost, "cached": cached, "purpose": "" if purpose == "answer" else purpose,
                          "tools": [], **_placed(chart, start, end)})
        elif message.role == Message.Role.TOOL:
            tool = {"kind": "tool", "seq": message.seq, "name": _text(payload.get("name")) or "a tool",
                    "error": bool(payload.get("error")), **_placed(chart, start, end)}
            if spans and spans[-1]["kind"] == "llm":
                spans[-1]["tools"].append(tool)
            else:
                spans.append(tool)
        elif message.role == Message.Role.USER and payload.get("revision"):
            spans.append({"kind": "revision", "seq": message.seq, "revision": payload.get("revision"),
                          "by": _text(payload.get("by_name")), "comment": excerpt(_text(payload.get("content")), 200),
                          **_placed(chart, end, end)})
        previous = end
    return spans


HANDOFF_ROLES = {Message.Role.DELEGATION, Message.Role.RESULT, Message.Role.FEEDBACK, Message.Role.DATA,
                 Message.Role.ERROR, Message.Role.CONTROL, Message.Role.AGGREGATED, Message.Role.SEQUENTIAL}


def _text(value) -> str:
    if value is None:
        return ""
    return value if isinstance(value, str) else pretty_json(value)


def message_view(message: Message) -> dict:
    """What the page shows of one message: its text (a conversation's content or a hand-off's text),
    the tool calls an answer asked for, a tool result's call, and the usage of a model answer."""
    payload = message.payload if isinstance(message.payload, dict) else {"content": message.payload}
    text = _text(payload.get("text") if "text" in payload and "content" not in payload else payload.get("content"))
    calls = []
    for call in payload.get("tool_calls") or []:
        if isinstance(call, dict):
            calls.append({"name": _text(call.get("name")), "id": _text(call.get("id")),
                          "arguments": pretty_json(call.get("arguments") if call.get("arguments") else
                                                   call.get("raw") or {})})
    usage = payload.get("usage") if isinstance(payload.get("usage"), dict) else None
    extra = {key: value for key, value in payload.items()
             if key not in ("text", "content", "tool_calls", "usage", "cache_hit", "model", "latency_ms", "purpose",
                            "name", "arguments", "tool_call_id", "error", "context_key", "revision", "by_name")}
    return {
        "seq": message.seq, "role": message.role, "role_label": message.get_role_display(),
        "handoff": message.role in HANDOFF_ROLES,
        "from": message.from_node_id, "to": message.to_node_id,
        "text": clipped(text), "long": len(text) > LONG_TEXT, "preview": excerpt(text, 240),
        "tool_calls": calls,
        "tool": {"name": _text(payload.get("name")), "arguments": pretty_json(payload.get("arguments") or {}),
                 "error": bool(payload.get("error")), "context_key": _text(payload.get("context_key")),
                 "call_id": _text(payload.get("tool_call_id"))} if message.role == Message.Role.TOOL else None,
        "usage": {"input": usage.get("input_tokens"), "output": usage.get("output_tokens"),
                  "model": _text(payload.get("model") or usage.get("model")),
                  "cache_hit": bool(payload.get("cache_hit")), "latency_ms": payload.get("latency_ms"),
                  "purpose": _text(payload.get("purpose"))} if usage else None,
        "extra": pretty_json(extra) if extra else "",
        "revision": payload.get("revision") if message.role == Message.Role.USER else None,
        "revision_by": _text(payload.get("by_name")),
    }


NODE_OPEN = (NodeInvocation.Status.RUNNING, NodeInvocation.Status.WAITING)  # its totals are not written yet


def node_view(node: NodeInvocation, node_messages: list[dict], can_act: bool, calls: NodeCalls | None = None) -> dict:
    """A node invocation's panel; an open node's stats are its calls so far (`calls`), an ended one's its totals."""
    if node.status in NODE_OPEN and calls is not None:
        stats = {"model": calls.models, "input_tokens": calls.input_tokens, "output_tokens": calls.output_tokens,
                 "usd_cost": usd(calls.usd_cost), "llm_calls": calls.calls, "cache_hits": calls.cache_hits}
    else:
        stats = {"model": node.model, "input_tokens": node.input_tokens, "output_tokens": node.output_tokens,
                 "usd_cost": usd(node.usd_cost), "llm_calls": node.llm_calls, "cache_hits": node.cache_hits}
    approval = node.approval if isinstance(node.approval, dict) else None
    sent = approval.get("sent") if approval and isinstance(approval.get("sent"), dict) else None
    if sent is not None:  # its moment is stored as ISO text: a datetime for the template to write
        sent = {**sent, "at": parse_datetime(sent["at"]) if isinstance(sent.get("at"), str) else None}
    decided = approval if approval and not approval.get("pending") and approval.get("decision") else None
    return {
        "seq": node.seq, "node_id": node.node_id, "status": "throttled" if node.throttled else node.status,
        "status_label": f"Throttled: {node.throttle_reason}" if node.throttled else node.get_status_display(),
        **stats, "attempt": node.attempt, "tool_calls": node.tool_calls,
        "duration": seconds_text(node.duration_ms / 1000) if node.duration_ms is not None else "-",
        "error": node.error, "next_nodes": node.next_nodes or [],
        "input": clipped(node.input), "input_long": len(node.input) > LONG_TEXT,
        "output": clipped(node.output), "output_long": len(node.output) > LONG_TEXT,
        "url": reverse("admin:workflows_nodeinvocation_change", args=[node.pk]),
        "awaiting_decision": bool(node.status == NodeInvocation.Status.WAITING and approval
                                  and approval.get("pending") and not sent),
        "can_decide": can_act,
        "sent": sent, "decided": decided,
        "revision": approval.get("revision", 0) if approval else 0,
        "history": [entry for entry in approval.get("history") or [] if isinstance(entry, dict)] if approval else [],
        "messages": node_messages,
    }


# ------------------------------------------------------------------------------- node invocations etc.

@admin.register(NodeInvocation)
class NodeInvocationAdmin(WorkspaceScopedAdmin, ReadOnlyAdmin):
    workspace_field = "workflow_invocation__workspace"
    list_display = ("id", "invocation_link", "seq", "node_id", "status", "model", "tokens", "usd_cost_text",
                    "started_at", "duration")
    list_filter = ("status",)
    search_fields = ("=node_id",)  # see get_search_results
    search_help_text = "An invocation id (its node invocations) or a node id."
    ordering = ("-workflow_invocation_id", "seq")
    show_full_result_count = False
    paginator = EstimatedCountPaginator
    fields = ("invocation_link", "seq", "node_id", "attempt", "status", "model", "usd_cost_text", "input_tokens",
              "output_tokens", "llm_calls", "cache_hits", "tool_calls", "started_at", "ended_at", "duration",
              "next_nodes", "approval_pretty", "error", "input", "summary", "output", "messages_link")
    readonly_fields = fields
    usd_cost_text = number_field("usd_cost", "usd", "USD cost")

    def get_queryset(self, request):
        return super().get_queryset(request).defer("input", "output", "summary", "large_summary")

    def get_object(self, request, object_id, from_field=None):
        return full_object(self, request, NodeInvocation.objects.all(), object_id)

    def get_search_results(self, request, queryset, search_term):
        term = search_term.strip()
        if term.isdigit() and term.isascii():
            return queryset.filter(Q(workflow_invocation_id=int(term)) | Q(node_id=term)), False
        return super().get_search_results(request, queryset, search_term)

    @admin.display(description="invocation", ordering="workflow_invocation_id")
    def invocation_link(self, node):
        return change_link("workflowinvocation", node.workflow_invocation_id, node.workflow_invocation_id)

    @admin.display(description="tokens (in / out)")
    def tokens(self, node):
        return f"{node.input_tokens:,} / {node.output_tokens:,}"

    @admin.display(description="duration")
    def duration(self, node):
        return seconds_text(node.duration_ms / 1000) if node.duration_ms is not None else "-"

    @admin.display(description="approval")
    def approval_pretty(self, node):
        return json_html(node.approval)

    @admin.display(description="messages")
    def messages_link(self, node):
        url = reverse("admin:workflows_message_changelist") + f"?node_invocation__id__exact={node.pk}"
        return format_html('<a href="{}">messages of this node invocation</a>', url)


@admin.register(Message)
class MessageAdmin(WorkspaceScopedAdmin, ReadOnlyAdmin):
    workspace_field = "workflow_invocation__workspace"
    list_display = ("seq", "invocation_link", "role", "route", "preview", "created_at")
    list_filter = ("role",)
    search_fields = ("=from_node_id", "=to_node_id")  # see get_search_results
    search_help_text = "An invocation id (all its messages, in order) or a node id."
    ordering = ("-workflow_invocation_id", "seq")
    show_full_result_count = False
    paginator = EstimatedCountPaginator
    list_per_page = 100
    fields = ("invocation_link", "node_invocation_link", "seq", "role", "from_node_id", "to_node_id", "payload_pretty",
              "created_at")
    readonly_fields = fields

    def get_search_results(self, request, queryset, search_term):
        term = search_term.strip()
        if term.isdigit() and term.isascii():
            match = Q(workflow_invocation_id=int(term)) | Q(from_node_id=term) | Q(to_node_id=term)
            return queryset.filter(match), False
        return super().get_search_results(request, queryset, search_term)

    @admin.display(description="invocation", ordering="workflow_invocation_id")
    def invocation_link(self, message):
        return change_link("workflowinvocation", message.workflow_invocation_id, message.workflow_invocation_id)

    @admin.display(description="node invocation")
    def node_invocation_link(self, message):
        if not message.node_invocation_id:
            return "-"
        return change_link("nodeinvocation", message.node_invocation_id, f"#{message.node_invocation_id}")

    @admin.display(description="from → to")
    def route(self, message):
        return f"{message.from_node_id or '-'} → {message.to_node_id or '-'}"

    @admin.display(description="message")
    def preview(self, message):
        view = message_view(message)
        if view["tool_calls"]:
            return excerpt(view["text"] + " [calls " + ", ".join(call["name"] for call in view["tool_calls"]) + "]",
                           160)
        return excerpt(view["text"], 160)

    @admin.display(description="payload")
    def payload_pretty(self, message):
        return json_html(message.payload)


@admin.register(ContextEntry)
class ContextEntryAdmin(WorkspaceScopedAdmin, ReadOnlyAdmin):
    """The blob is served by this admin only (scoped, as an attachment), never from a public media URL."""

    workspace_field = "workflow_invocation__workspace"
    list_display = ("key", "scope", "invocation_link", "size", "content_type", "created_at", "download_link")
    list_filter = ("scope",)
    search_fields = ("=key",)  # see get_search_results
    search_help_text = "An invocation id (its entries) or a key."
    ordering = ("-created_at", "-id")
    show_full_result_count = False
    paginator = EstimatedCountPaginator
    fields = ("invocation_link", "node_invocation_link", "scope", "key", "size", "content_type", "summary",
              "metadata_pretty", "download_link", "created_at")
    readonly_fields = fields
    # served inline only as plain text or JSON; anything else (HTML, SVG...) is a download of bytes
    SAFE_TYPES = {"text/plain", "application/json", "text/csv", "text/markdown"}

    def get_search_results(self, request, queryset, search_term):
        term = search_term.strip()
        if term.isdigit() and term.isascii():
            return queryset.filter(Q(workflow_invocation_id=int(term)) | Q(key=term)), False
        return super().get_search_results(request, queryset, search_term)

    def get_urls(self):
        info = f"{self.opts.app_label}_{self.opts.model_name}"
        return [path("<path:object_id>/download/", self.admin_site.admin_view(self.download_view),
                     name=f"{info}_download"), *super().get_urls()]

    def download_view(self, request, object_id):
        entry = self.get_object(request, unquote(object_id))
        if entry is None:
            return self._get_obj_does_not_exist_redirect(request, self.opts, object_id)
        if not self.has_view_permission(request, entry):
            raise PermissionDenied
        try:
            blob = entry.data.open("rb")
        except (FileNotFoundError, ValueError):
            raise Http404("The blob of this context entry is missing from storage.") from None
        content_type = entry.content_type.split(";")[0].strip().lower()
        content_type = f"{content_type}; charset=utf-8" if content_type in self.SAFE_TYPES \
            else "application/octet-stream"
        response = FileResponse(blob, as_attachment=True, filename=PurePosixPath(entry.data.name).name or entry.key,
                                content_type=content_type)
        response["X-Content-Type-Options"] = "nosniff"
        response["Content-Security-Policy"] = "sandbox"
        return response

    @admin.display(description="invocation", ordering="workflow_invocation_id")
    def invocation_link(self, entry):
        return change_link("workflowinvocation", entry.workflow_invocation_id, entry.workflow_invocation_id)

    @admin.display(description="node invocation")
    def node_invocation_link(self, entry):
        if not entry.node_invocation_id:
            return "-"
        return change_link("nodeinvocation", entry.node_invocation_id, f"#{entry.node_invocation_id}")

    @admin.display(description="metadata")
    def metadata_pretty(self, entry):
        return json_html(entry.metadata)

    @admin.display(description="blob")
    def download_link(self, entry):
        url = reverse("admin:workflows_contextentry_download", args=[entry.pk])
        return format_html('<a href="{}">download ({} bytes)</a>', url, entry.size)


@admin.register(LlmCall)
class LlmCallAdmin(WorkspaceScopedAdmin, ReadOnlyAdmin):
    list_display = ("short_key", "provider", "model", "hits", "input_tokens", "output_tokens", "usd_cost_text",
                    "created_at", "last_hit_at")
    list_filter = (WorkspaceFilter,)
    search_fields = ("^key", "=model")
    search_help_text = "The start of a cache key, or a model name."
    ordering = ("-created_at", "-id")
    show_full_result_count = False
    paginator = EstimatedCountPaginator
    fields = ("workspace", "key", "provider", "model", "hits", "input_tokens", "output_tokens", "usd_cost_text",
              "created_at", "last_hit_at", "response_pretty")
    readonly_fields = fields
    usd_cost_text = number_field("usd_cost", "usd", "USD cost")

    def get_queryset(self, request):
        return super().get_queryset(request).defer("response")

    def get_object(self, request, object_id, from_field=None):
        return full_object(self, request, LlmCall.objects.select_related("workspace"), object_id)

    @admin.display(description="key", ordering="key")
    def short_key(self, call):
        return call.key[:16]

    @admin.display(description="response")
    def response_pretty(self, call):
        return json_html(call.response)


# --------------------------------------------------------------------------------------- MCP registry

class McpServerVersionInline(admin.TabularInline):
    model = McpServerVersion
    fields = ("version", "spec_version", "status", "manifest_hash", "synced_at", "tool_names")
    readonly_fields = fields
    extra = 0
    can_delete = False
    show_change_link = True
    ordering = ("-synced_at",)

    def get_queryset(self, request):
        return super().get_queryset(request).prefetch_related(
            Prefetch("tools", queryset=McpTool.objects.only("pk", "name", "server_version_id").order_by("name")))

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    @admin.display(description="tools")
    def tool_names(self, version):
        return ", ".join(tool.name for tool in version.tools.all()) or "-"


@admin.register(McpServer)
class McpServerAdmin(WorkspaceScopedAdmin, admin.ModelAdmin):
    list_display = ("slug", "display_name", "workspace", "url", "active_version", "updated_at")
    list_filter = [("workspace", admin.RelatedOnlyFieldListFilter)]
    list_select_related = ("workspace",)
    search_fields = ("slug", "display_name", "url")
    fields = ("workspace", "slug", "display_name", "url", "description", "repository_url", "created_at", "updated_at")
    readonly_fields = ("created_at", "updated_at")
    inlines = (McpServerVersionInline,)
    formfield_overrides = {models.URLField: {"assume_scheme": "https"}}

    def get_queryset(self, request):
        return super().get_queryset(request).prefetch_related(Prefetch(
            "versions", queryset=McpServerVersion.objects.filter(status=McpServerVersion.Status.ACTIVE)
            .annotate(tool_count=Count("tools")), to_attr="active_versions"))

    @admin.display(description="active version")
    def active_version(self, server):
        active = server.active_versions[0] if server.active_versions else None
        if active is None:
            return "not synced"
        return f"{active.version or active.manifest_hash[:12]} ({active.tool_count} tools)"


class McpToolInline(admin.TabularInline):
    model = McpTool
    fields = ("name", "description", "input_schema_pretty")
    readonly_fields = fields
    extra = 0
    can_delete = False
    ordering = ("name",)

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    @admin.display(description="input schema")
    def input_schema_pretty(self, tool):
        return json_html(tool.input_schema)


@admin.register(McpServerVersion)
class McpServerVersionAdmin(WorkspaceScopedAdmin, ReadOnlyAdmin):
    workspace_field = "server__workspace"
    list_display = ("server", "version", "spec_version", "status", "tool_count", "synced_at")
    list_filter = ("status",)
    list_select_related = ("server",)
    search_fields = ("server__slug", "version")
    ordering = ("server__slug", "-synced_at")
    fields = ("server", "version", "spec_version", "status", "manifest_hash", "synced_at", "capabilities_pretty")
    readonly_fields = fields
    inlines = (McpToolInline,)

    def get_queryset(self, request):
        return super().get_queryset(request).annotate(tool_count=Count("tools"))

    @admin.display(description="tools", ordering="tool_count")
    def tool_count(self, version):
        return version.tool_count

    @admin.display(description="capabilities")
    def capabilities_pretty(self, version):
        return json_html(version.capabilities)


class UserServerConfigForm(forms.ModelForm):
    """The secrets are write-only: the form never holds them; filling `new_secrets` replaces them."""

    new_secrets = forms.CharField(
        label="replace secrets", required=False, strip=True,
        widget=forms.PasswordInput(render_value=False, attrs={"autocomplete": "new-password", "size": 60}),
        help_text='A JSON object of header names to values, e.g. {"Authorization": "Bearer ..."}; encrypted at rest '
                  "and never shown again. Leave empty to keep the current secrets.")
    clear_secrets = forms.BooleanField(label="clear secrets", required=False)

    class Meta:
        model = UserServerConfig
        fields = ("user", "server", "config", "enabled")

    def clean_new_secrets(self):
        text = self.cleaned_data["new_secrets"]
        if not text:
            return ""
        try:
            value = json.loads(text)
        except ValueError:
            raise ValidationError("Not valid JSON (the value is not shown back; type it again).") from None
        if not isinstance(value, dict) or not all(isinstance(key, str) and isinstance(item, str)
                                                  for key, item in value.items()):
            raise ValidationError("Give a JSON object of header names to string values.")
        return json.dumps(value, sort_keys=True)

    def clean_config(self):
        config = self.cleaned_data.get("config") or {}
        if not isinstance(config, dict):
            raise ValidationError("Give a JSON object (for example {\"headers\": {...}}).")
        headers = config.get("headers", {})
        if not isinstance(headers, dict) or not all(isinstance(value, str) for value in headers.values()):
            raise ValidationError("`headers` must be an object of header names to strings.")
        return config

    def clean(self):
        data = super().clean()
        if data.get("new_secrets") and data.get("clear_secrets"):
            raise ValidationError("Either replace the secrets or clear them, not both.")
        return data


@admin.register(UserServerConfig)
class UserServerConfigAdmin(WorkspaceScopedAdmin, admin.ModelAdmin):
    """Scoped through the server's workspace; a staff user who is not a superuser sees and edits only
    their own configs (another user's headers are theirs)."""

    workspace_field = "server__workspace"
    form = UserServerConfigForm
    list_display = ("user", "server", "enabled", "secrets_state", "updated_at")
    list_filter = ("enabled",)
    list_select_related = ("user", "server")
    search_fields = ("server__slug", "user__username")
    raw_id_fields = ("user",)
    fields = ("user", "server", "config", "enabled", "secrets_state", "new_secrets", "clear_secrets", "created_at",
              "updated_at")
    readonly_fields = ("secrets_state", "created_at", "updated_at")

    def get_queryset(self, request):
        # the secrets column is never read here (not even decrypted): only whether it is empty
        queryset = super().get_queryset(request).defer("secrets").annotate(
            secrets_set=ExpressionWrapper(~Q(secrets=""), output_field=BooleanField()))
        return queryset if sees_everything(request) else queryset.filter(user=request.user)

    def formfield_for_foreignkey(self, db_field, request, **kwargs):
        if db_field.name == "user" and not sees_everything(request):
            kwargs["queryset"] = get_user_model().objects.filter(pk=request.user.pk)
            kwargs["initial"] = request.user.pk
        return super().formfield_for_foreignkey(db_field, request, **kwargs)

    def get_changeform_initial_data(self, request):
        return {"user": request.user.pk, **super().get_changeform_initial_data(request)}

    @admin.display(description="secrets")
    def secrets_state(self, config):
        if config.pk is None:
            return "not set"
        return "set" if getattr(config, "secrets_set", False) else "not set"

    def save_model(self, request, obj, form, change):
        if form.cleaned_data.get("clear_secrets"):
            obj.secrets = ""
        elif form.cleaned_data.get("new_secrets"):
            obj.secrets = form.cleaned_data["new_secrets"]
        super().save_model(request, obj, form, change)

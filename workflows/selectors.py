"""Reads on workflows and their versions."""

from __future__ import annotations

import difflib
import json
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal

from django.contrib.postgres.aggregates import StringAgg
from django.db.models import Avg, BigIntegerField, Count, DecimalField, DurationField, F, Q, QuerySet, Sum
from django.db.models.expressions import ExpressionWrapper
from django.db.models.fields.json import KT
from django.db.models.functions import Cast

from workflows import dsl as dsl_module
from workflows.models import Message, VersionActivation, WorkflowInvocation, WorkflowVersion

NODE_FIELDS_COMPARED = ("description", "gatewayModelId", "mcpTools", "codeTools", "handOffs", "handOffType",
                        "waitFor", "skills", "maxSteps", "requiresApproval")


def activation_current(*, workflow_id: int) -> VersionActivation | None:
    """The activation in effect for a workflow (its latest; its version is the active one), with its
    parent: the activation a rollback returns to."""
    return VersionActivation.objects.filter(workflow_id=workflow_id).select_related(
        "parent__workflow_version").order_by("-id").first()


def rollback_target(*, workflow_id: int) -> WorkflowVersion | None:
    """The version a rollback would re-activate: the one active before the current activation."""
    current = activation_current(workflow_id=workflow_id)
    return current.parent.workflow_version if current is not None and current.parent is not None else None


def _pretty(dsl: dict) -> list[str]:
    return json.dumps(dsl_module.canonical(dsl), indent=2, sort_keys=True, ensure_ascii=False).splitlines()


def version_diff(old: WorkflowVersion, new: WorkflowVersion) -> dict:
    """What changed from `old` to `new`: a unified diff of their canonical DSL, and per node whether it
    was added, removed, changed (with the fields that changed and a diff of its system prompt) or kept."""
    dsl_diff = list(difflib.unified_diff(_pretty(old.dsl), _pretty(new.dsl), fromfile=old.dsl_hash[:12],
                                         tofile=new.dsl_hash[:12], lineterm=""))
    before = {node["nodeId"]: node for node in old.dsl["nodes"]}
    after = {node["nodeId"]: node for node in new.dsl["nodes"]}
    nodes = {}
    for node_id in sorted(before.keys() | after.keys()):
        if node_id not in before:
            nodes[node_id] = {"change": "added"}
            continue
        if node_id not in after:
            nodes[node_id] = {"change": "removed"}
            continue
        a, b = before[node_id], after[node_id]
        fields = [field for field in NODE_FIELDS_COMPARED if _compared(field, a[field]) != _compared(field, b[field])]
        prompt = list(difflib.unified_diff(a["systemPrompt"].splitlines(), b["systemPrompt"].splitlines(),
                                           fromfile=f"{node_id} (old)", tofile=f"{node_id} (new)", lineterm=""))
        if prompt:
            fields.append("systemPrompt")
        nodes[node_id] = {"change": "changed" if fields else "same", "fields": fields, "prompt_diff": prompt}
    if old.dsl.get("entryNodeId") != new.dsl.get("entryNodeId"):
        nodes.setdefault("__entry__", {"change": "changed", "fields": ["entryNodeId"], "prompt_diff": []})
    return {"from": old.dsl_hash, "to": new.dsl_hash, "same": old.dsl_hash == new.dsl_hash,
            "dsl_diff": dsl_diff, "nodes": nodes}


def _compared(field: str, value):
    """A node field as the version's identity sees it: a set's order means nothing, a hand-off list's does."""
    return sorted(value) if field in dsl_module.SET_FIELDS and isinstance(value, list) else value


def version_lookup(ref: str) -> WorkflowVersion:
    """A version by its id or by a prefix of its hash (at least 6 characters), in any workspace (the
    operator's CLI); LookupError with the reason when none or several match."""
    queryset = WorkflowVersion.objects.select_related("workflow")
    if ref.isdigit() and ref.isascii():
        match = queryset.filter(pk=int(ref)).first()
        if match is not None:
            return match
    if len(ref) < 6:
        raise LookupError(f"no version {ref!r} (give an id, or at least 6 characters of a hash)")
    matches = list(queryset.filter(dsl_hash__startswith=ref.lower())[:2])
    if not matches:
        raise LookupError(f"no version {ref!r}")
    if len(matches) > 1:
        raise LookupError(f"{ref!r} matches several versions; give more of the hash")
    return matches[0]


_LINEAGE_SQL = """
WITH RECURSIVE lineage(id) AS (
    SELECT step.id FROM {table} AS start JOIN {table} AS step ON {join} WHERE start.id = %s
    UNION
    SELECT step.id FROM lineage
    JOIN {table} AS start ON start.id = lineage.id
    JOIN {table} AS step ON {join}
)
SELECT version.id, version.parent1_id, version.parent2_id FROM {table} AS version
WHERE version.id IN (SELECT id FROM lineage) OR version.id = %s
"""
_UP = "step.id = start.parent1_id OR step.id = start.parent2_id"
_DOWN = "step.parent1_id = start.id OR step.parent2_id = start.id"


def _lineage(version_id: int, join: str, max_depth: int, *, up: bool) -> list[tuple[int, int]]:
    """One recursive query over version ids (UNION: each version is walked once, however many paths lead
    to it, and crossovers make many), then each version's nearest distance by a breadth-first walk."""
    from collections import deque

    from django.db import connection

    sql = _LINEAGE_SQL.format(table=WorkflowVersion._meta.db_table, join=join)
    with connection.cursor() as cursor:
        cursor.execute(sql, [version_id, version_id])
        rows = cursor.fetchall()
    edges: dict[int, list[int]] = {}
    for node, *parents in rows:
        for parent in parents:
            if parent is None:
                continue
            if up:
                edges.setdefault(node, []).append(parent)
            else:
                edges.setdefault(parent, []).append(node)
    depth: dict[int, int] = {}
    queue = deque([(version_id, 0)])
    while queue:
        node, distance = queue.popleft()
        if distance >= max_depth:
            continue
        for neighbour in edges.get(node, ()):
            if neighbour not in depth and neighbour != version_id:
                depth[neighbour] = distance + 1
                queue.append((neighbour, distance + 1))
    return sorted(depth.items(), key=lambda item: (item[1], item[0]))


def version_ancestors(version: WorkflowVersion | int, *, max_depth: int = 10_000) -> list[tuple[int, int]]:
    """Every ancestor of a version through either parent, as (version id, generations back), nearest
    first: one recursive query."""
    return _lineage(getattr(version, "pk", version), _UP, max_depth, up=True)


def version_descendants(version: WorkflowVersion | int, *, max_depth: int = 10_000) -> list[tuple[int, int]]:
    """Every descendant of a version (children through either parent, theirs, ...), as (version id,
    generations down), nearest first: one recursive query."""
    return _lineage(getattr(version, "pk", version), _DOWN, max_depth, up=False)


@dataclass(frozen=True)
class NodeCalls:
    """What a node invocation's model calls recorded so far (its assistant messages)."""

    calls: int
    cache_hits: int
    input_tokens: int
    output_tokens: int
    usd_cost: Decimal
    models: str


def node_calls(*, invocation_id: int, node_ids=None) -> dict[int, NodeCalls]:
    """{node invocation id: its calls so far} from the answers in the transcript, one query, counted as the
    runner counts them (an answer from the cache is a call that paid nothing: its usage is the original
    call's). A node writes its totals when it ends; a running or waiting node has only these (each answer
    is recorded as it arrives), and so has one ended with its invocation (cancelled, failed)."""
    usage = "payload__usage__"
    paid = ~Q(payload__cache_hit=True)
    answers = Message.objects.filter(workflow_invocation_id=invocation_id, role=Message.Role.ASSISTANT,
                                     node_invocation__isnull=False)
    if node_ids is not None:
        answers = answers.filter(node_invocation_id__in=node_ids)
    rows = (answers.values("node_invocation_id").order_by("node_invocation_id")
            .annotate(calls=Count("pk"),
                      cache_hits=Count("pk", filter=Q(payload__cache_hit=True)),
                      input_tokens=Sum(Cast(KT(f"{usage}input_tokens"), BigIntegerField()), filter=paid),
                      output_tokens=Sum(Cast(KT(f"{usage}output_tokens"), BigIntegerField()), filter=paid),
                      usd_cost=Sum(Cast(KT(f"{usage}usd_cost"), DecimalField(max_digits=18, decimal_places=10)),
                                   filter=paid),
                      models=StringAgg(KT("payload__model"), ", ", distinct=True, default="")))
    return {row.pop("node_invocation_id"): NodeCalls(
        calls=row["calls"], cache_hits=row["cache_hits"], input_tokens=row["input_tokens"] or 0,
        output_tokens=row["output_tokens"] or 0, usd_cost=row["usd_cost"] or Decimal(0), models=row["models"])
        for row in rows}


# ------------------------------------------------------------------------------ invocation statistics

@dataclass(frozen=True)
class InvocationStats:
    """Totals of a set of invocations: how many, how many ended and failed, what they cost, how long they took."""

    total: int
    ended: int
    failed: int
    usd_cost: Decimal
    avg_usd_cost: Decimal | None
    avg_seconds: float | None

    @property
    def failure_rate(self) -> float | None:
        """Failed among the ended ones (a running invocation has not failed yet)."""
        return self.failed / self.ended if self.ended else None


def invocation_stats(invocations: QuerySet) -> InvocationStats:
    """One aggregate over `invocations` (the caller bounds them: a time window, a slice of ids)."""
    row = invocations.order_by().aggregate(
        total=Count("pk"), ended=Count("pk", filter=Q(status__in=WorkflowInvocation.TERMINAL)),
        failed=Count("pk", filter=Q(status=WorkflowInvocation.Status.FAILED)),
        total_cost=Sum("usd_cost"), mean_cost=Avg("usd_cost"),
        avg_duration=Avg(ExpressionWrapper(F("ended_at") - F("started_at"), output_field=DurationField()),
                         filter=Q(started_at__isnull=False, ended_at__isnull=False)))
    duration = row["avg_duration"]
    return InvocationStats(total=row["total"], ended=row["ended"], failed=row["failed"],
                           usd_cost=row["total_cost"] or Decimal(0), avg_usd_cost=row["mean_cost"],
                           avg_seconds=duration.total_seconds() if duration is not None else None)


def workflow_invocation_stats(*, workflow, since: datetime) -> InvocationStats:
    """The invocations of `workflow`'s versions created since `since` (workflows_inv_ws_created_idx: a range of
    the workflow's workspace)."""
    return invocation_stats(WorkflowInvocation.objects.filter(
        workspace_id=workflow.workspace_id, workflow_version__workflow_id=workflow.pk, created_at__gte=since))


def version_invocation_stats(*, version_id: int, limit: int) -> InvocationStats:
    """The latest `limit` invocations of a version (workflows_inv_version_idx); a total of `limit` means
    `limit` or more."""
    latest = WorkflowInvocation.objects.filter(workflow_version_id=version_id).order_by("-created_at") \
        .values("pk")[:limit]
    return invocation_stats(WorkflowInvocation.objects.filter(pk__in=latest))


def workflow_invocations_recent(*, workflow, limit: int) -> list[WorkflowInvocation]:
    """The newest invocations of `workflow`'s versions, without their payloads, each with its version's hash
    (workflows_inv_ws_created_idx)."""
    return list(WorkflowInvocation.objects.filter(workspace_id=workflow.workspace_id,
                                                  workflow_version__workflow_id=workflow.pk)
                .annotate(version_hash=F("workflow_version__dsl_hash"))
                .only("pk", "status", "usd_cost", "started_at", "ended_at", "created_at", "workflow_version_id")
                .order_by("-created_at", "-pk")[:limit])


def workflow_versions_recent(*, workflow_id: int, limit: int) -> list[WorkflowVersion]:
    """The newest versions of a workflow without their DSL (the (workflow, dsl_hash) index finds them)."""
    return list(WorkflowVersion.objects.filter(workflow_id=workflow_id)
                .only("pk", "dsl_hash", "operation", "status", "avg_score", "pass_rate", "commit_message",
                      "created_at", "generation")
                .order_by("-created_at", "-pk")[:limit])


# ------------------------------------------------------------------------------------------ eval scores

def _eval_runs() -> QuerySet:
    """The eval runs of versions. `evals` sits above this app, which reaches its model through the link
    evals made to WorkflowVersion (no import of evals)."""
    return WorkflowVersion._meta.get_field("eval_runs").related_model.objects.all()


def _completed_full_runs(runs: QuerySet) -> QuerySet:
    model = runs.model
    # a minibatch run (evolution's first look at a candidate) scores only some items: not the version's score
    return runs.filter(status=model.Status.COMPLETED, avg_score__isnull=False).exclude(config__has_key="item_ids")


def workflow_eval_scores(*, workflow, limit: int) -> list[dict]:
    """The newest completed eval runs over whole golden sets of `workflow`'s versions, oldest first:
    {"pk", "avg_score", "pass_rate", "at", "version_id", "version_hash", "golden_set_id", "set_name"}
    (evals_run_ws_created_idx: a range of the workflow's workspace, newest first)."""
    rows = (_completed_full_runs(_eval_runs()).filter(workspace_id=workflow.workspace_id,
                                                      workflow_version__workflow_id=workflow.pk)
            .values("pk", "avg_score", "pass_rate", "golden_set_id", version_id=F("workflow_version_id"),
                    version_hash=F("workflow_version__dsl_hash"), set_name=F("golden_set__name"),
                    at=F("created_at"))
            .order_by("-created_at", "-pk")[:limit])
    return list(reversed(rows))


def version_latest_eval(*, version_id: int) -> dict | None:
    """The version's newest completed eval run over a whole golden set: {"pk", "avg_score", "pass_rate",
    "at", "set_name"}, or None (the eval runs' workflow_version index)."""
    return (_completed_full_runs(_eval_runs()).filter(workflow_version_id=version_id)
            .values("pk", "avg_score", "pass_rate", set_name=F("golden_set__name"), at=F("created_at"))
            .order_by("-created_at", "-pk").first())

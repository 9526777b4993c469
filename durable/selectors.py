"""Reads on durable runs for the API, the admin and the CLI.

Every selector takes an optional `namespaces` restriction (an iterable of names or a
subquery of them); ``ScopedRunReader`` fixes it to one namespace, so a run of another
namespace is simply not found. Lists defer the payload columns; payloads are decoded
through ``durable.codec.decode`` (with column and row labels), so a damaged value reads
as missing, is reported once and never breaks the read. No selector issues per-row queries.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.db.models import Count, Exists, F, Max, Min, OuterRef, Q, QuerySet, Sum
from django.db.models.functions import Coalesce

from durable.codec import decode, decode_strict
from durable.errors import InvalidFilter, RunNotFound, Undecodable
from durable.models import DurableRun, RunAttribute, StepCheckpoint

PAYLOAD_COLUMNS = ("input", "output", "error")
ATTRIBUTE_OPS = ("eq", "ne", "gt", "gte", "lt", "lte")
NUMERIC_OPS = frozenset({"gt", "gte", "lt", "lte"})
DEFAULT_ORDERING = ("-created_at", "-id")
ORDERABLE = frozenset({"created_at", "started_at", "ended_at", "updated_at", "workflow", "status", "priority", "id"})


@dataclass(frozen=True)
class AttributeFilter:
    key: str
    op: str
    value: str

    @classmethod
    def parse(cls, text: str) -> AttributeFilter:
        """Parse ``key:op:value`` (the value may itself contain colons)."""
        parts = text.split(":", 2)
        if len(parts) != 3 or not parts[0]:
            raise InvalidFilter("attr", f"{text!r} is not key:op:value (op one of {', '.join(ATTRIBUTE_OPS)}).")
        return cls.of(*parts)

    @classmethod
    def of(cls, key: str, op: str, value) -> AttributeFilter:
        if op not in ATTRIBUTE_OPS:
            raise InvalidFilter("attr", f"Unknown comparison {op!r} for {key!r}: "
                                        f"use one of {', '.join(ATTRIBUTE_OPS)}.")
        if op in NUMERIC_OPS and _number(value) is None:
            raise InvalidFilter("attr", f"{key}:{op} needs a number, not {value!r}.")
        return cls(key=str(key), op=op, value=str(value))


def _number(value) -> float | None:
    if isinstance(value, bool):
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def _attribute_condition(item: AttributeFilter) -> Q:
    """One EXISTS over RunAttribute, served by its (key, value) or (key, value_num) index."""
    number = _number(item.value)
    rows = RunAttribute.objects.filter(run_id=OuterRef("pk"), key=item.key)
    if item.op in NUMERIC_OPS:
        rows = rows.filter(**{f"value_num__{item.op}": number})
    else:
        same = Q(value=item.value) | Q(value_num=number) if number is not None else Q(value=item.value)
        # ne: the run has the attribute, with another value
        rows = rows.filter(same) if item.op == "eq" else rows.exclude(same)
    return Q(Exists(rows))


def _as_list(value) -> list | None:
    if value is None:
        return None
    if isinstance(value, str):
        return [value]
    return list(value)


def run_filter(queryset: QuerySet, *, namespaces=None, workflow: str | Sequence[str] | None = None,
               statuses: Iterable[str] | None = None, tags: Iterable[str] | None = None,
               attributes: Iterable[AttributeFilter | tuple] = (), parent: str | None = None,
               created_after: datetime | None = None, created_before: datetime | None = None) -> QuerySet:
    """Apply the list's predicates to a run queryset (shared by the list, facets and bulk actions).

    Tags match runs carrying all of them; attribute comparisons are (key, op, value) with op in
    eq/ne/gt/gte/lt/lte (gt..lte compare numerically; eq/ne match the text or the number)."""
    if namespaces is not None:
        queryset = queryset.filter(namespace__in=[namespaces] if isinstance(namespaces, str) else namespaces)
    workflows = _as_list(workflow)
    if workflows:
        queryset = queryset.filter(workflow__in=workflows) if len(workflows) > 1 else queryset.filter(
            workflow=workflows[0])
    statuses = _as_list(statuses)
    if statuses:
        unknown = sorted(set(statuses) - set(DurableRun.Status.values))
        if unknown:
            raise InvalidFilter("status", f"Unknown status {', '.join(unknown)}.")
        queryset = queryset.filter(status__in=statuses)
    tags = _as_list(tags)
    if tags:
        queryset = queryset.filter(tags__contains=tags)
    for item in attributes or ():
        if not isinstance(item, AttributeFilter):
            item = AttributeFilter.of(*item)
        queryset = queryset.filter(_attribute_condition(item))
    if parent:
        queryset = queryset.filter(parent_id=parent)
    if created_after is not None:
        queryset = queryset.filter(created_at__gte=created_after)
    if created_before is not None:
        queryset = queryset.filter(created_at__lt=created_before)
    return queryset


def _ordering(ordering: Sequence[str] | None) -> list[str]:
    fields = list(ordering or DEFAULT_ORDERING)
    for name in fields:
        if name.lstrip("-") not in ORDERABLE:
            raise InvalidFilter("ordering", f"Cannot order by {name!r}: use {', '.join(sorted(ORDERABLE))}.")
    if not any(name.lstrip("-") == "id" for name in fields):
        fields.append("-id" if fields[0].startswith("-") else "id")  # a unique tie-breaker for stable pages
    return fields


def run_list(*, ordering: Sequence[str] | None = None, **filters) -> QuerySet:
    """Runs matching the filters (see run_filter), newest first by default, without payload columns."""
    queryset = DurableRun.objects.defer(*PAYLOAD_COLUMNS)
    return run_filter(queryset, **filters).order_by(*_ordering(ordering))


def facets_of(queryset: QuerySet) -> dict:
    """Counts by status and by workflow of a (filtered) run queryset: one GROUP BY status, workflow."""
    rows = queryset.order_by().values("status", "workflow").annotate(n=Count("*"))
    by_status = {status: 0 for status in DurableRun.Status.values}
    by_workflow: dict[str, int] = {}
    total = 0
    for row in rows:
        by_status[row["status"]] += row["n"]
        by_workflow[row["workflow"]] = by_workflow.get(row["workflow"], 0) + row["n"]
        total += row["n"]
    return {"total": total, "status": by_status, "workflow": dict(sorted(by_workflow.items()))}


def run_facets(**filters) -> dict:
    """{"total": n, "status": {status: n}, "workflow": {name: n}} over the list's predicates."""
    return facets_of(run_filter(DurableRun.objects.all(), **filters))


# ------------------------------------------------------------------------------------------- one run


def _decode(text: str, *, column: str, row: str) -> tuple[object, bool]:
    """(value, decodable). An undecodable payload is reported once (by codec.decode) and reads as None."""
    try:
        return decode_strict(text), True
    except Undecodable:
        decode(text, column=column, row=row)
        return None, False


def _run(run_id: str, namespaces, *, payloads: bool) -> DurableRun:
    queryset = DurableRun.objects.all() if payloads else DurableRun.objects.defer(*PAYLOAD_COLUMNS)
    queryset = run_filter(queryset, namespaces=namespaces)
    run = queryset.filter(pk=run_id).first()
    if run is None:
        raise RunNotFound(run_id)
    return run


def run_ids_resolve(run_id: str, *, namespaces: Sequence[str]) -> list[str]:
    """The stored ids an API caller of `namespaces` may mean by `run_id`: the id itself, or the
    "<namespace>:<run_id>" of a caller-chosen id (see services.caller_run_id); the exact id first."""
    candidates = [run_id, *(f"{namespace}:{run_id}" for namespace in namespaces)]
    found = set(DurableRun.objects.filter(pk__in=candidates, namespace__in=namespaces).values_list("id", flat=True))
    return [candidate for candidate in candidates if candidate in found]


def _run_exists(run_id: str, namespaces) -> None:
    if not run_filter(DurableRun.objects.filter(pk=run_id), namespaces=namespaces).exists():
        raise RunNotFound(run_id)


def attribute_value(value: str, value_num: float | None):
    if value_num is None:
        return value
    return int(value_num) if value_num.is_integer() else value_num


@dataclass
class RunDetail:
    run: DurableRun
    input: object
    output: object
    error: object
    undecodable: list[str]
    children: list[str]
    attributes: dict

    @property
    def id(self) -> str:
        return self.run.id


def run_detail(run_id: str, *, namespaces=None) -> RunDetail:
    """A run with its input, output and error decoded (an undecodable one reads as None and is listed in
    `undecodable`), its children's ids and its attributes. Raises RunNotFound."""
    run = _run(run_id, namespaces, payloads=True)
    decoded, undecodable = {}, []
    for column in PAYLOAD_COLUMNS:
        decoded[column], ok = _decode(getattr(run, column), column=f"run.{column}", row=run.id)
        if not ok:
            undecodable.append(column)
    children = list(DurableRun.objects.filter(parent_id=run.id).order_by("created_at", "id")
                    .values_list("id", flat=True))
    attributes = {key: attribute_value(value, number) for key, value, number in
                  RunAttribute.objects.filter(run_id=run.id).order_by("key").values_list("key", "value", "value_num")}
    return RunDetail(run=run, undecodable=undecodable, children=children, attributes=attributes, **decoded)


def run_children(run_id: str, *, namespaces=None) -> QuerySet:
    """A run's direct children, oldest first, without payloads. Raises RunNotFound."""
    _run_exists(run_id, namespaces)
    return run_filter(DurableRun.objects.defer(*PAYLOAD_COLUMNS), namespaces=namespaces).filter(
        parent_id=run_id).order_by("created_at", "id")


def _seconds(start: datetime | None, end: datetime | None) -> float | None:
    if start is None or end is None:
        return None
    return (end - start) / timedelta(seconds=1)


@dataclass
class TimelineEntry:
    seq: int
    name: str
    kind: str
    status: str
    attempt: int
    parallel_group: int | None
    queue: str
    child_run_id: str
    created_at: datetime
    started_at: datetime | None
    completed_at: datetime | None
    queue_seconds: float | None  # started_at - created_at
    run_seconds: float | None  # completed_at - started_at (a wait: completed_at - created_at)
    payloads_included: bool = False
    input: object = None
    output: object = None
    error: object = None
    undecodable: list[str] = field(default_factory=list)


TIMELINE_COLUMNS = ("seq", "name", "kind", "status", "attempt", "parallel_group", "queue", "child_run_id",
                    "created_at", "started_at", "completed_at")


def run_timeline(run_id: str, *, include_payloads: bool = False, after_seq: int | None = None,
                 limit: int | None = None, namespaces=None) -> list[TimelineEntry]:
    """A run's checkpoints in seq order with queue duration (started - created; none for waits) and run
    duration (completed - started) in seconds; a wait (sleep, signal, event, child) starts when it is
    written. Payloads are read and decoded only when asked. Keyset pages with
    `after_seq` / `limit` over the (run, seq) key. Raises RunNotFound."""
    _run_exists(run_id, namespaces)
    columns = TIMELINE_COLUMNS + (PAYLOAD_COLUMNS if include_payloads else ())
    queryset = StepCheckpoint.objects.filter(run_id=run_id, fence=F("run__fence")).order_by("seq")
    if after_seq is not None:
        queryset = queryset.filter(seq__gt=after_seq)
    if limit is not None:
        queryset = queryset[:limit]
    entries = []
    for row in queryset.values(*columns):
        entry = TimelineEntry(**{name: row[name] for name in TIMELINE_COLUMNS},
                              queue_seconds=(_seconds(row["created_at"], row["started_at"])
                                             if row["kind"] in ("step", "value") else None),
                              run_seconds=_seconds(row["started_at"] or row["created_at"], row["completed_at"]))
        if include_payloads:
            entry.payloads_included = True
            for column in PAYLOAD_COLUMNS:
                value, ok = _decode(row[column], column=f"checkpoint.{column}", row=f"{run_id}#{row['seq']}")
                setattr(entry, column, value)
                if not ok:
                    entry.undecodable.append(column)
        entries.append(entry)
    return entries


def fan_stats(run_id: str, group: int | None = None, *, namespaces=None) -> list[dict]:
    """Per-fan statistics: one GROUP BY parallel_group, status, kind over the run's checkpoints, each
    bucket with its count, seq and timestamp bounds and attempt sum. Sequential checkpoints form the
    bucket whose parallel_group is None. Raises RunNotFound."""
    _run_exists(run_id, namespaces)
    queryset = StepCheckpoint.objects.filter(run_id=run_id, fence=F("run__fence"))
    if group is not None:
        queryset = queryset.filter(parallel_group=group)
    return list(
        queryset.order_by().values("parallel_group", "status", "kind").annotate(
            count=Count("*"), min_seq=Min("seq"), max_seq=Max("seq"), first_created_at=Min("created_at"),
            first_started_at=Min("started_at"), last_completed_at=Max("completed_at"), attempts=Sum("attempt"),
        ).order_by("parallel_group", "status", "kind")
    )


@dataclass
class GanttRow:
    """One row of a run's Gantt chart: a sequential checkpoint, or a whole fan (parallel_group) folded into
    one row spanning its first start to its last end."""

    seq: int
    name: str
    kind: str
    status: str
    parallel_group: int | None
    start: datetime | None
    end: datetime | None
    count: int = 1
    failed: int = 0
    open: int = 0


def run_gantt(run_id: str, *, limit: int, namespaces=None) -> tuple[list[GanttRow], bool]:
    """The first `limit` rows of a run's Gantt chart in seq order, and whether there are more: its
    sequential checkpoints one a row, each fan one row. Two queries whatever the fans' sizes: the
    sequential checkpoints through the (run, seq) key, the fans as one GROUP BY parallel_group through
    the partial (run, parallel_group, seq) index; each read at most `limit` + 1 rows. Raises RunNotFound."""
    _run_exists(run_id, namespaces)
    current = StepCheckpoint.objects.filter(run_id=run_id, fence=F("run__fence"))
    rows = [GanttRow(seq=seq, name=name, kind=kind, status=status, parallel_group=None,
                     start=started_at or created_at, end=completed_at,
                     failed=int(status == StepCheckpoint.Status.FAILED),
                     open=int(status in StepCheckpoint.Status.OPEN))
            for seq, name, kind, status, created_at, started_at, completed_at in
            current.filter(parallel_group__isnull=True).order_by("seq").values_list(
                "seq", "name", "kind", "status", "created_at", "started_at", "completed_at")[:limit + 1]]
    fans = current.filter(parallel_group__isnull=False).order_by().values("parallel_group").annotate(
        first_seq=Min("seq"), count=Count("*"), start=Min(Coalesce("started_at", "created_at")),
        end=Max("completed_at"), failed=Count("pk", filter=Q(status=StepCheckpoint.Status.FAILED)),
        open=Count("pk", filter=Q(status__in=StepCheckpoint.Status.OPEN)),
        children=Count("pk", filter=Q(kind=StepCheckpoint.Kind.CHILD)),
    ).order_by("first_seq")[:limit + 1]
    for fan in fans:
        status = ("failed" if fan["failed"] else "running" if fan["open"] else StepCheckpoint.Status.COMPLETED)
        kind = "child" if fan["children"] == fan["count"] else "step"
        rows.append(GanttRow(seq=fan["first_seq"], name=f"fan {fan['parallel_group']}", kind=kind, status=status,
                             parallel_group=fan["parallel_group"], start=fan["start"],
                             end=None if fan["open"] else fan["end"], count=fan["count"], failed=fan["failed"],
                             open=fan["open"]))
    rows.sort(key=lambda row: row.seq)
    return rows[:limit], len(rows) > limit


class ScopedRunReader:
    """The read side restricted to one namespace: a run of any other namespace is not found."""

    def __init__(self, namespace: str):
        self.namespace = namespace

    def list(self, **filters) -> QuerySet:
        filters.pop("namespaces", None)
        return run_list(namespaces=[self.namespace], **filters)

    def facets(self, **filters) -> dict:
        filters.pop("namespaces", None)
        return run_facets(namespaces=[self.namespace], **filters)

    def detail(self, run_id: str) -> RunDetail:
        return run_detail(run_id, namespaces=[self.namespace])

    def timeline(self, run_id: str, **options) -> list[TimelineEntry]:
        return run_timeline(run_id, namespaces=[self.namespace], **options)

    def children(self, run_id: str) -> QuerySet:
        return run_children(run_id, namespaces=[self.namespace])

    def fan_stats(self, run_id: str, group: int | None = None) -> list[dict]:
        return fan_stats(run_id, group, namespaces=[self.namespace])


def scoped(namespace: str) -> ScopedRunReader:
    return ScopedRunReader(namespace)


ENDED_UNFINISHED = tuple(sorted(DurableRun.Status.TERMINAL - {DurableRun.Status.COMPLETED}))


def runs_ended_without_owner(rows: QuerySet, *, limit: int) -> list[tuple[int, str, str]]:
    """Of `rows` (active rows a durable run drives: invocations, eval runs, evolution runs), at most
    `limit`, oldest first, that no run will end any more, as (row pk, "cancelled" or "failed", reason):
    those whose run ended other than completed or no longer exists (cancelled from the durable admin,
    declared dead, deleted), and those no run has begun whose `parent_run` (the run that wrote the row
    for a child of its own, when the model has that column) has ended or no longer exists (cancelled
    before its children began). durable.owners.reconcile uses it to give each owner's rows the end
    their run could not write.

    The test is in the query, before the limit: any number of legitimately active rows cannot hide one
    to end. Each run is read by its primary key, so the scan costs what the rows' own active-rows index
    serves."""
    # a missing run reads as a NULL status through the (left) join: a run's status is never NULL
    run_ended = Q(durable_run_id__isnull=False) & (Q(durable_run__status__isnull=True)
                                                   | Q(durable_run__status__in=ENDED_UNFINISHED))
    columns = ["pk", "durable_run_id", "durable_run__status"]
    if any(field.name == "parent_run" for field in rows.model._meta.concrete_fields):
        run_ended |= Q(durable_run_id__isnull=True, parent_run_id__isnull=False) & (
            Q(parent_run__status__isnull=True) | Q(parent_run__status__in=DurableRun.Status.TERMINAL))
        columns += ["parent_run_id", "parent_run__status"]
    ended = []
    for pk, run_id, status, *parent in rows.filter(run_ended).order_by("pk").values_list(*columns)[:limit]:
        if run_id is not None:
            ended.append((pk, *_run_end(status, f"its durable run {run_id}")))
        else:
            parent_id, parent_status = parent
            ended.append((pk, *_run_end(parent_status, f"it never began, and its parent run {parent_id}")))
    return ended


def _run_end(status: str | None, subject: str) -> tuple[str, str]:
    if status is None:
        return "failed", f"{subject} no longer exists"
    if status == DurableRun.Status.CANCELLED:
        return "cancelled", f"{subject} was cancelled"
    return "failed", f"{subject} ended {status}"

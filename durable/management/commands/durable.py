"""Operate durable runs from a shell: list, show, start, signal, cancel, retry, purge."""

from __future__ import annotations

import json
from datetime import timedelta

from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone

from durable import selectors, services
from durable.errors import InvalidFilter, InvalidRunState, RunNotFound, UnknownWorkflow
from durable.models import DurableRun
from durable.retention import delete_runs


def _json_arg(text: str | None, option: str):
    if text is None:
        return None
    try:
        return json.loads(text)
    except ValueError as exc:
        raise CommandError(f"{option} is not valid JSON: {exc}") from None


def _when(value) -> str:
    return timezone.localtime(value).strftime("%Y-%m-%d %H:%M:%S") if value else "-"


def _seconds(value) -> str:
    return "-" if value is None else f"{value:.3f}"


def table(headers: list[str], rows: list[list]) -> str:
    """Columns padded to their widest cell."""
    cells = [[str(cell) for cell in row] for row in rows]
    widths = [max([len(header), *(len(row[index]) for row in cells)]) for index, header in enumerate(headers)]
    lines = ["  ".join(header.ljust(width) for header, width in zip(headers, widths, strict=True)).rstrip(),
             "  ".join("-" * width for width in widths)]
    lines += ["  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
              for row in cells]
    return "\n".join(lines)


def _statuses(values: list[str] | None) -> list[str] | None:
    if not values:
        return None
    statuses = [status for value in values for status in value.split(",") if status]
    unknown = sorted(set(statuses) - set(DurableRun.Status.values))
    if unknown:
        raise CommandError(f"Unknown status {', '.join(unknown)}; use {', '.join(DurableRun.Status.values)}.")
    return statuses


class Command(BaseCommand):
    help = "Operate durable runs: list, show, start, signal, cancel, retry, purge."

    def add_arguments(self, parser):
        sub = parser.add_subparsers(dest="subcommand", required=True, metavar="{list,show,start,signal,cancel,retry,"
                                                                             "purge}")

        listing = sub.add_parser("list", help="List runs, newest first.")
        listing.add_argument("--status", action="append", help="A status (repeatable, or comma-separated).")
        listing.add_argument("--workflow")
        listing.add_argument("--namespace")
        listing.add_argument("--tag", action="append")
        listing.add_argument("--attr", action="append", help="Attribute comparison key:op:value, e.g. amount:gte:10.")
        listing.add_argument("--limit", type=int, default=50)

        show = sub.add_parser("show", help="A run with its payloads, attributes, children and timeline.")
        show.add_argument("run_id")
        show.add_argument("--payloads", action="store_true", help="Include checkpoint payloads in the timeline.")

        start = sub.add_parser("start", help="Start a run of a registered workflow.")
        start.add_argument("workflow")
        start.add_argument("--input", help="JSON input.")
        start.add_argument("--namespace", default="default")
        start.add_argument("--id", dest="run_id")
        start.add_argument("--tag", action="append", default=[])
        start.add_argument("--priority", type=int, default=0)

        signal = sub.add_parser("signal", help="Send a signal to an active run.")
        signal.add_argument("run_id")
        signal.add_argument("name")
        signal.add_argument("--payload", help="JSON payload.")

        cancel = sub.add_parser("cancel", help="Cancel an active run and its active descendants.")
        cancel.add_argument("run_id")
        cancel.add_argument("--reason", default="cancelled from the command line")
        cancel.add_argument("--compensate", action="store_true",
                            help="also start the workflow's registered compensation workflow")

        retry = sub.add_parser("retry", help="Retry a failed, cancelled or dead run.")
        retry.add_argument("run_id")
        retry.add_argument("--input", help="JSON: start over from the first step with this input.")

        purge = sub.add_parser("purge", help="Delete terminal runs (a dry run unless --yes).")
        purge.add_argument("--status", action="append", help="Terminal status(es); default all terminal ones.")
        purge.add_argument("--older-than-days", type=float, help="Only runs that ended more than N days ago.")
        purge.add_argument("--workflow")
        purge.add_argument("--namespace")
        purge.add_argument("--yes", action="store_true", help="Really delete.")

    def handle(self, *args, subcommand, **options):
        getattr(self, f"do_{subcommand}")(**options)

    def _out(self, text: str = "") -> None:
        self.stdout.write(text)

    # ---------------------------------------------------------------------------------- reads

    def do_list(self, *, status, workflow, namespace, tag, attr, limit, **_):
        if limit < 1:
            raise CommandError("--limit must be at least 1.")
        try:
            attributes = [selectors.AttributeFilter.parse(text) for text in attr or []]
            runs = list(selectors.run_list(statuses=_statuses(status), workflow=workflow, namespaces=namespace,
                                           tags=tag, attributes=attributes)[:limit])
        except InvalidFilter as exc:
            raise CommandError(f"--{exc.param}: {exc.message}") from None
        if not runs:
            self._out("No runs match.")
            return
        self._out(table(["ID", "WORKFLOW", "NAMESPACE", "STATUS", "CREATED", "ENDED", "TURNS"],
                        [[run.id, run.workflow, run.namespace, run.status, _when(run.created_at), _when(run.ended_at),
                          run.turns] for run in runs]))

    def do_show(self, *, run_id, payloads, **_):
        try:
            detail = selectors.run_detail(run_id)
            timeline = selectors.run_timeline(run_id, include_payloads=payloads)
        except RunNotFound:
            raise CommandError(f"No run {run_id!r}.") from None
        run = detail.run
        fields = [("id", run.id), ("workflow", run.workflow), ("namespace", run.namespace), ("status", run.status),
                  ("tags", ", ".join(run.tags) or "-"), ("priority", run.priority), ("parent", run.parent_id or "-"),
                  ("turns", run.turns), ("recovery attempts", run.recovery_attempts),
                  ("created", _when(run.created_at)), ("started", _when(run.started_at)),
                  ("ended", _when(run.ended_at))]
        width = max(len(name) for name, _ in fields)
        for name, value in fields:
            self._out(f"{name.ljust(width)}  {value}")
        for column in selectors.PAYLOAD_COLUMNS:
            value = "(undecodable)" if column in detail.undecodable else json.dumps(
                getattr(detail, column), indent=2, default=str)
            self._out(f"\n{column}:\n{value}")
        if detail.attributes:
            self._out("\nattributes:")
            self._out(table(["KEY", "VALUE"], [[key, value] for key, value in detail.attributes.items()]))
        if detail.children:
            self._out("\nchildren:\n" + "\n".join(detail.children))
        self._out("\ntimeline:")
        headers = ["SEQ", "NAME", "KIND", "STATUS", "ATTEMPT", "GROUP", "QUEUED(s)", "RAN(s)"]
        rows = []
        for entry in timeline:
            row = [entry.seq, entry.name, entry.kind, entry.status, entry.attempt,
                   "" if entry.parallel_group is None else entry.parallel_group,
                   _seconds(entry.queue_seconds), _seconds(entry.run_seconds)]
            if payloads:
                row += [self._compact(entry, "output"), self._compact(entry, "error")]
            rows.append(row)
        if payloads:
            headers += ["OUTPUT", "ERROR"]
        self._out(table(headers, rows) if rows else "(no checkpoints)")

    @staticmethod
    def _compact(entry, column: str) -> str:
        if column in entry.undecodable:
            return "(undecodable)"
        value = getattr(entry, column)
        if value is None:
            return ""
        text = json.dumps(value, default=str, ensure_ascii=False)
        return text if len(text) <= 80 else text[:77] + "..."

    # --------------------------------------------------------------------------------- writes

    def do_start(self, *, workflow, input, namespace, run_id, tag, priority, **_):
        try:
            run = services.run_start(workflow=workflow, input=_json_arg(input, "--input"), run_id=run_id,
                                     namespace=namespace, tags=tag, priority=priority)
        except UnknownWorkflow as exc:
            raise CommandError(str(exc)) from None
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        self._out(f"{run.id}  {run.workflow}  {run.status}")

    def do_signal(self, *, run_id, name, payload, **_):
        try:
            result = services.signal_send(run_id=run_id, name=name, payload=_json_arg(payload, "--payload"))
        except RunNotFound:
            raise CommandError(f"No run {run_id!r}.") from None
        except InvalidRunState as exc:
            raise CommandError(str(exc)) from None
        self._out(f"signal {name!r} {result} to {run_id}")

    def _status(self, run_id: str) -> str:
        status = DurableRun.objects.filter(pk=run_id).values_list("status", flat=True).first()
        if status is None:
            raise CommandError(f"No run {run_id!r}.")
        return status

    def do_cancel(self, *, run_id, reason, compensate=False, **_):
        status = self._status(run_id)
        if not services.run_cancel(run_id=run_id, reason=reason, compensate=compensate):
            raise CommandError(f"Run {run_id} is {status}; only pending, running or suspended runs can be cancelled.")
        self._out(f"cancelled {run_id}")

    def do_retry(self, *, run_id, input, **_):
        status = self._status(run_id)
        new_input = input is not None
        if not services.run_retry(run_id=run_id, input=_json_arg(input, "--input"), new_input=new_input):
            raise CommandError(f"Run {run_id} is {status}; only failed, cancelled or dead runs can be retried.")
        self._out(f"retrying {run_id}" + (" with new input" if new_input else ""))

    def do_purge(self, *, status, older_than_days, workflow, namespace, yes, **_):
        statuses = _statuses(status) or sorted(DurableRun.Status.TERMINAL)
        active = sorted(set(statuses) - DurableRun.Status.TERMINAL)
        if active:
            raise CommandError(f"Only terminal runs can be purged, not {', '.join(active)}.")
        if older_than_days is not None and older_than_days < 0:
            raise CommandError("--older-than-days must not be negative.")
        queryset = selectors.run_filter(DurableRun.objects.all(), statuses=statuses, workflow=workflow,
                                        namespaces=namespace)
        if older_than_days is not None:
            queryset = queryset.filter(ended_at__lt=timezone.now() - timedelta(days=older_than_days))
        if not yes:
            facets = selectors.facets_of(queryset)
            counts = [[name, count] for name, count in facets["status"].items() if count]
            self._out(f"{facets['total']} runs would be deleted (dry run; add --yes to delete).")
            if counts:
                self._out(table(["STATUS", "RUNS"], counts))
            return
        deleted = 0
        while True:
            ids = list(queryset.order_by().values_list("id", flat=True)[:5000])
            if not ids:
                break
            removed = delete_runs(ids)
            deleted += removed
            if removed == 0:
                break  # what is left turned active meanwhile
        self._out(f"deleted {deleted} runs")

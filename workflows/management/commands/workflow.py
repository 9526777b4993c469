"""Import, export, compare and run workflow versions from the shell."""

import json
import time
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from workflows.dsl import DslError
from workflows.models import Workflow
from workflows.selectors import version_diff, version_lookup
from workflows.services import workflow_create, workflow_version_create
from workspaces.models import Workspace


class Command(BaseCommand):
    help = "Workflow versions: import DSL files, export a version's DSL, diff two versions, run one."

    def add_arguments(self, parser):
        sub = parser.add_subparsers(dest="action", required=True)
        imp = sub.add_parser("import", help="Import DSL JSON files as versions (the same DSL twice is one version).")
        imp.add_argument("files", nargs="+", type=Path)
        imp.add_argument("--workspace", required=True, metavar="SLUG")
        imp.add_argument("--workflow", metavar="NAME", help="The workflow to add them to (default: each file's name).")
        imp.add_argument("--message", default="", help="The versions' commit message.")
        exp = sub.add_parser("export", help="Print a version's DSL as JSON.")
        exp.add_argument("version", help="A version id or at least 6 characters of its hash.")
        diff = sub.add_parser("diff", help="What changed between two versions: the DSL and each node's prompt.")
        diff.add_argument("old")
        diff.add_argument("new")
        run = sub.add_parser("run", help="Invoke a version and print its progress node by node, then its output.")
        run.add_argument("version", help="A version id or at least 6 characters of its hash.")
        run.add_argument("--input", default="{}", help='The input as JSON (default {}), e.g. \'{"text": "..."}\'.')
        run.add_argument("--node-budget", type=int, default=None, help="Node invocations allowed (default 14).")
        run.add_argument("--usd-budget", default=None, help="USD the invocation may spend (default 1.00).")
        run.add_argument("--workers", action="store_true",
                         help="Leave the run to the Celery workers and follow it (default: run it in this process).")
        run.add_argument("--timeout", type=float, default=600, help="Seconds to follow the invocation (600).")

    def handle(self, *args, action, **options):
        return getattr(self, f"_{action}")(**options)

    def _import(self, *, files, workspace, workflow=None, message="", **options):
        space = Workspace.objects.filter(slug=workspace).first()
        if space is None:
            raise CommandError(f"No workspace with the slug {workspace!r}.")
        failed = 0
        for path in files:
            try:
                document = json.loads(path.read_text())
            except (OSError, ValueError) as exc:
                self.stderr.write(self.style.ERROR(f"{path}: cannot be read as JSON: {exc}"))
                failed += 1
                continue
            name = workflow or path.stem
            target = Workflow.objects.filter(workspace=space, name=name).first() or workflow_create(
                workspace=space, name=name)
            try:
                version, created = workflow_version_create(workflow=target, dsl=document,
                                                           commit_message=message or f"imported from {path.name}")
            except DslError as exc:
                self.stderr.write(self.style.ERROR(f"{path}: not a valid workflow:"))
                for field, errors in exc.errors.items():
                    for error in errors:
                        self.stderr.write(f"  {field}: {error}")
                failed += 1
                continue
            state = "imported" if created else "already there"
            self.stdout.write(f"{path}: {state} as version {version.pk} ({version.dsl_hash[:12]}) of {name!r}")
            if version.unresolved_tools:
                self.stdout.write(self.style.WARNING(
                    "  tools this installation lacks (an invocation is refused until they exist): "
                    + ", ".join(version.unresolved_tools)))
        if failed:
            raise CommandError(f"{failed} of {len(files)} files were not imported")

    def _export(self, *, version, **options):
        try:
            found = version_lookup(version)
        except LookupError as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(json.dumps(found.dsl, indent=2, ensure_ascii=False))

    def _diff(self, *, old, new, **options):
        try:
            a, b = version_lookup(old), version_lookup(new)
        except LookupError as exc:
            raise CommandError(str(exc)) from None
        result = version_diff(a, b)
        if result["same"]:
            self.stdout.write("The two versions are the same workflow.")
            return
        for node_id, change in result["nodes"].items():
            if change["change"] == "same":
                continue
            fields = ", ".join(change.get("fields") or [])
            self.stdout.write(self.style.MIGRATE_HEADING(f"{node_id}: {change['change']}"
                                                         + (f" ({fields})" if fields else "")))
            for line in change.get("prompt_diff") or []:
                self.stdout.write(f"  {line}")
        self.stdout.write("")
        for line in result["dsl_diff"]:
            self.stdout.write(line)

    def _run(self, *, version, input, node_budget=None, usd_budget=None, workers=False, timeout=600.0, **options):
        from durable.inprocess import drive_in_background
        from workflows.models import NodeInvocation, WorkflowInvocation
        from workflows.services import InvocationRefused, invocation_start

        try:
            found = version_lookup(version)
            payload = json.loads(input)
        except LookupError as exc:
            raise CommandError(str(exc)) from None
        except ValueError as exc:
            raise CommandError(f"--input is not JSON: {exc}") from None
        try:
            invocation = invocation_start(version=found, input=payload, node_budget=node_budget, usd_budget=usd_budget)
        except InvocationRefused as exc:
            lines = [f"  {field}: {error}" for field, errors in exc.errors.items() for error in errors]
            raise CommandError("The version cannot run here:\n" + "\n".join(lines)) from None
        self.stdout.write(f"invocation {invocation.pk} of version {found.pk} ({found.dsl_hash[:12]}), "
                          f"run {invocation.durable_run_id}")
        driver = None if workers else drive_in_background(invocation.durable_run_id, max_wait=timeout)
        shown: dict[int, str] = {}
        deadline = time.monotonic() + timeout
        while True:
            invocation.refresh_from_db()
            for row in NodeInvocation.objects.filter(workflow_invocation=invocation).order_by("seq"):
                if shown.get(row.seq) == row.status:
                    continue
                shown[row.seq] = row.status
                self._node_line(row)
            if invocation.status in WorkflowInvocation.TERMINAL:
                break
            if invocation.status == WorkflowInvocation.Status.WAITING and (driver is None or not driver.is_alive()):
                self.stdout.write(self.style.WARNING(
                    f"waiting for approval: POST /api/workflow-invocations/{invocation.pk}/approve/ or use the admin"))
                return
            if time.monotonic() > deadline or (driver is not None and not driver.is_alive()
                                               and invocation.status not in WorkflowInvocation.TERMINAL):
                invocation.refresh_from_db()
                if invocation.status in WorkflowInvocation.TERMINAL:
                    continue
                raise CommandError(f"invocation {invocation.pk} is still {invocation.status}; "
                                   "start the workers (make run) or follow it in the admin")
            time.sleep(0.2)
        self.stdout.write("")
        totals = (f"{invocation.node_count} node invocations, {invocation.llm_calls} model calls "
                  f"({invocation.cache_hits} from the cache), {invocation.input_tokens + invocation.output_tokens} "
                  f"tokens, ${invocation.usd_cost:.6f}")
        if invocation.status != WorkflowInvocation.Status.COMPLETED:
            raise CommandError(f"invocation {invocation.pk} {invocation.status}: {invocation.error}\n{totals}")
        self.stdout.write(self.style.SUCCESS(f"completed: {totals}"))
        self.stdout.write(invocation.output.get("text", "") if isinstance(invocation.output, dict)
                          else json.dumps(invocation.output))

    def _node_line(self, row) -> None:
        style = {"completed": self.style.SUCCESS, "failed": self.style.ERROR, "rejected": self.style.ERROR,
                 "waiting": self.style.WARNING}.get(row.status, str)
        line = f"  [{row.seq}] {row.node_id}: {row.status}"
        if row.status in ("completed", "failed", "rejected"):
            line += (f" ({row.model or '-'}, {row.llm_calls} calls, {row.tool_calls} tools, "
                     f"{row.input_tokens + row.output_tokens} tokens, ${row.usd_cost:.6f})")
            if row.next_nodes:
                line += f" -> {', '.join(row.next_nodes)}"
        self.stdout.write(style(line))
        if row.error:
            self.stdout.write(f"      {row.error}")
        elif row.summary and row.status == "completed":
            self.stdout.write(f"      {row.summary[:160]}")

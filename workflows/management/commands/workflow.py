"""Import, export and compare workflow versions from the shell."""

import json
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from workflows.dsl import DslError
from workflows.models import Workflow
from workflows.selectors import version_diff, version_lookup
from workflows.services import workflow_create, workflow_version_create
from workspaces.models import Workspace


class Command(BaseCommand):
    help = "Workflow versions: import DSL files, export a version's DSL, diff two versions."

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

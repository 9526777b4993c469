"""Seed workspaces' skill libraries from a pack of SKILL.md folders (idempotent)."""

from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from knowledge.services import SKILL_PACK_DIR, skill_files, skills_seed
from workspaces.models import Workspace


class Command(BaseCommand):
    help = ("Seed skills from a directory of skill folders (each with a SKILL.md) into one workspace or all. "
            "Unchanged skills are skipped, changed ones become a new active version; malformed files are "
            "reported and do not stop the others.")

    def add_arguments(self, parser):
        parser.add_argument("--path", type=Path, default=SKILL_PACK_DIR,
                            help="The skill pack directory (default: the pack Lineage ships).")
        parser.add_argument("--workspace", metavar="SLUG", help="Only this workspace (default: every workspace).")
        parser.add_argument("--dry-run", action="store_true", help="Report what would change, write nothing.")
        parser.add_argument("--prune", action="store_true",
                            help="Deactivate seeded skills whose folder is no longer in the pack.")

    def handle(self, *args, path: Path, workspace=None, dry_run=False, prune=False, **options):
        if not path.is_dir():
            raise CommandError(f"{path} is not a directory")
        if not skill_files(path):
            raise CommandError(f"{path} holds no SKILL.md files")
        if workspace:
            workspaces = list(Workspace.objects.filter(slug=workspace))
            if not workspaces:
                raise CommandError(f"No workspace with the slug {workspace!r}.")
        else:
            workspaces = list(Workspace.objects.order_by("slug"))
            if not workspaces:
                raise CommandError("There is no workspace yet: create one, or pass --workspace SLUG.")
        errors = 0
        prefix = "[dry run] would have " if dry_run else ""
        for ws in workspaces:
            report = skills_seed(workspace=ws, root=path, dry_run=dry_run, prune=prune)
            self.stdout.write(self.style.MIGRATE_HEADING(f"{ws.slug}:"))
            for label, names in (("created", report.created), ("updated", report.updated),
                                 ("skipped (unchanged)", report.skipped), ("pruned", report.pruned)):
                if names:
                    verb = f"{prefix}{label}" if label.startswith(("created", "updated", "pruned")) else label
                    self.stdout.write(f"  {verb}: {len(names)}  " + ", ".join(names))
            if ws is workspaces[0]:  # the same files for every workspace: report them once
                for file, reason in report.errors:
                    self.stderr.write(self.style.ERROR(f"  malformed {path / file}: {reason}"))
                for file, warning in report.warnings:
                    self.stderr.write(self.style.WARNING(f"  warning: {path / file}: {warning}"))
            errors = max(errors, len(report.errors))
            self.stdout.write(
                f"  {len(report.created)} created, {len(report.updated)} updated, {len(report.skipped)} skipped, "
                f"{len(report.pruned)} pruned, {len(report.errors)} malformed"
            )
        if errors:
            raise CommandError(f"{errors} malformed skill file(s); the others were seeded.")

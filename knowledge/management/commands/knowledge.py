"""Knowledge base maintenance: `manage.py knowledge reembed [--workspace SLUG] [--all] [--background]`."""

from __future__ import annotations

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from knowledge import services
from knowledge.models import KnowledgeSource
from knowledge.selectors import embedding_column_width
from workspaces.models import Workspace


class Command(BaseCommand):
    help = ("reembed: re-embed the knowledge sources embedded with another model than EMBEDDING_MODEL (--all: "
            "every source), each as a durable run; when EMBEDDING_DIMENSIONS changed, first moves the stored "
            "vectors to the new width. Run it with the workers stopped or already on the new settings.")
    # it is what the start-up check of a changed vector width asks for, so that check must not stop it
    requires_system_checks = []

    def add_arguments(self, parser):
        commands = parser.add_subparsers(dest="action", required=True)
        reembed = commands.add_parser("reembed", help="re-embed stale sources (see the command's help)")
        reembed.add_argument("--workspace", metavar="SLUG", help="only this workspace's sources")
        reembed.add_argument("--all", action="store_true", help="every indexed source, not only the stale ones")
        reembed.add_argument("--background", action="store_true",
                             help="start the runs and return; the Celery workers finish them")

    def handle(self, *args, action, workspace=None, all=False, background=False, **options):
        workspaces = Workspace.objects.order_by("pk")
        if workspace:
            workspaces = workspaces.filter(slug=workspace)
            if not workspaces.exists():
                raise CommandError(f"No workspace with the slug {workspace!r}.")
        width, wanted = embedding_column_width(), settings.EMBEDDING_DIMENSIONS
        if width is not None and width != wanted:
            if workspace:  # the column is every workspace's: the others would search placeholder vectors
                raise CommandError(f"The stored vectors are {width} wide and EMBEDDING_DIMENSIONS is {wanted}: a "
                                   "change of width re-embeds every workspace; run it without --workspace.")
            services.embedding_width_change(dimensions=wanted)
            self.stdout.write(f"stored vectors moved from {width} to {wanted} dimensions; every indexed source "
                              "is marked for re-embedding")
        runs = []
        for space in workspaces:
            started = services.workspace_reembed(workspace=space, stale_only=not all)
            self.stdout.write(f"{space.slug}: {len(started)} source(s) to re-embed with {settings.EMBEDDING_MODEL}")
            runs.extend(started)
        if background or not runs:
            return
        from durable.inprocess import run_until_settled

        failed = 0
        for run in runs:
            run_until_settled(run.pk, max_wait=3600)
        for source in KnowledgeSource.objects.filter(ingest_run_id__in=[run.pk for run in runs]).order_by("pk"):
            if source.ingest_status == KnowledgeSource.Status.INDEXED:
                self.stdout.write(self.style.SUCCESS(f"re-embedded #{source.pk} {source.title!r}"))
            else:
                failed += 1
                self.stderr.write(self.style.ERROR(f"failed #{source.pk} {source.title!r}: {source.ingest_error}"))
        if failed:
            raise CommandError(f"{failed} source(s) could not be re-embedded")

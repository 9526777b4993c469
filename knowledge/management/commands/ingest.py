"""Ingest files, directories and URLs into a workspace's knowledge base, with a progress bar."""

from __future__ import annotations

import time
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from knowledge import services
from knowledge.extraction import SUPPORTED_EXTENSIONS
from knowledge.models import KnowledgeSource
from workspaces.models import Workspace


class ProgressBar:
    """A one-line bar on a terminal; plain lines elsewhere (logs, CI)."""

    def __init__(self, stream, total: int, width: int = 30):
        self.stream, self.total, self.width = stream, max(total, 1), width
        self.tty = hasattr(stream, "isatty") and stream.isatty()
        self.started = time.monotonic()

    def update(self, done: int, note: str = "") -> None:
        filled = int(self.width * done / self.total)
        elapsed = time.monotonic() - self.started
        line = f"[{'#' * filled}{'.' * (self.width - filled)}] {done}/{self.total} {elapsed:5.1f}s {note}"
        if self.tty:
            self.stream.write("\r" + line[:150].ljust(150))
            self.stream.flush()
        else:
            self.stream.write(line + "\n")

    def close(self) -> None:
        if self.tty:
            self.stream.write("\n")


class Command(BaseCommand):
    help = ("Ingest files (.txt .md .html .csv .pdf .docx), directories of them, and URLs into a workspace. "
            "By default the ingestion runs in this process, so no worker is needed; --background leaves it to "
            "the Celery workers.")

    def add_arguments(self, parser):
        parser.add_argument("targets", nargs="*", metavar="PATH_OR_URL")
        parser.add_argument("--workspace", metavar="SLUG")
        parser.add_argument("--title", default="", help="Title of the source (only with a single target).")
        parser.add_argument("--chunk-size", type=int, default=None)
        parser.add_argument("--chunk-overlap", type=int, default=None)
        parser.add_argument("--force", action="store_true", help="Ingest again even when the content is unchanged.")
        parser.add_argument("--background", action="store_true", help="Start the runs and return at once.")
        parser.add_argument("--bulk", action="store_true",
                            help="Bulk import: drop the chunk table's global full-text (GIN) and vector (HNSW) "
                                 "indexes, ingest, then build them once. Much faster for large loads, but while it "
                                 "runs full-text and unfiltered vector searches of every workspace scan the whole "
                                 "table: for an initial import or a maintenance window. Not with --background.")
        parser.add_argument("--restore-indexes", action="store_true",
                            help="Only recreate the chunk indexes an interrupted --bulk left missing, then exit.")

    def handle(self, *args, targets, workspace, title="", chunk_size=None, chunk_overlap=None, force=False,
               background=False, bulk=False, restore_indexes=False, **options):
        if restore_indexes:
            from knowledge.bulk import restore_indexes as restore

            built = restore()
            self.stdout.write(", ".join(f"built {name} in {seconds:.1f}s" for name, seconds in built.items())
                              or "no index was missing")
            return
        if not targets or not workspace:
            raise CommandError("give one or more PATH_OR_URL and --workspace SLUG")
        if bulk and background:
            raise CommandError("--bulk drives the runs in this process: it cannot be combined with --background")
        ws = Workspace.objects.filter(slug=workspace).first()
        if ws is None:
            raise CommandError(f"No workspace with the slug {workspace!r}.")
        items = self._expand(targets)
        if title and len(items) > 1:
            raise CommandError("--title needs a single file or URL")
        sources: list[KnowledgeSource] = []
        failures = 0
        for kind, target in items:
            common = {"workspace": ws, "title": title, "chunk_size": chunk_size, "chunk_overlap": chunk_overlap}
            try:
                if kind == "url":
                    source, created = services.source_create_url(url=target, **common)
                else:
                    path = Path(target)
                    source, created = services.source_create_file(name=path.name, data=path.read_bytes(), **common)
            except (services.KnowledgeError, OSError) as exc:
                self.stderr.write(self.style.ERROR(f"{target}: {exc}"))
                failures += 1
                continue
            if not created:
                if force or source.ingest_status == KnowledgeSource.Status.FAILED:
                    try:
                        services.source_ingest(source=source, force=True)
                    except services.IngestInProgress:
                        self.stdout.write(f"{target}: being ingested already (source #{source.pk})")
                        continue
                else:
                    self.stdout.write(f"{target}: unchanged, already source #{source.pk} ({source.ingest_status})")
                    continue
            sources.append(source)
        if background or not sources:
            for source in sources:
                self.stdout.write(f"started source #{source.pk} {source.title!r} (run {source.ingest_run_id})")
            if failures:
                raise CommandError(f"{failures} target(s) could not be ingested")
            return
        if bulk:
            from knowledge.bulk import deferred_indexes

            self.stdout.write("bulk mode: the global full-text and vector indexes are rebuilt at the end")
            with deferred_indexes() as report:
                failures += self._drive(sources)
            self.stdout.write(f"indexes rebuilt: full text {report['gin_seconds']:.1f}s, "
                              f"vector {report['hnsw_seconds']:.1f}s")
        else:
            failures += self._drive(sources)
        if failures:
            raise CommandError(f"{failures} target(s) could not be ingested")

    def _expand(self, targets: list[str]) -> list[tuple[str, str]]:
        items = []
        for target in targets:
            if target.startswith(("http://", "https://")):
                items.append(("url", target))
                continue
            path = Path(target)
            if path.is_dir():
                found = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix.lower() in SUPPORTED_EXTENSIONS)
                if not found:
                    self.stderr.write(f"{target}: no {', '.join(SUPPORTED_EXTENSIONS)} files")
                items.extend(("file", str(p)) for p in found)
            elif path.is_file():
                items.append(("file", str(path)))
            else:
                raise CommandError(f"{target}: no such file or directory (URLs start with http:// or https://)")
        return items

    def _drive(self, sources: list[KnowledgeSource]) -> int:
        from durable.inprocess import run_until_settled

        bar = ProgressBar(self.stdout, len(sources))
        bar.update(0)
        failures, chunks = 0, 0
        results = []
        for index, source in enumerate(sources, start=1):
            run_until_settled(source.ingest_run_id, max_wait=600)
            source.refresh_from_db()
            if source.ingest_status == KnowledgeSource.Status.INDEXED:
                chunks += source.chunk_count
            else:
                failures += 1
            results.append(source)
            bar.update(index, f"{chunks:,} chunks  {source.title[:50]}")
        bar.close()
        for source in results:
            if source.ingest_status == KnowledgeSource.Status.INDEXED:
                self.stdout.write(self.style.SUCCESS(f"indexed #{source.pk} {source.title!r}: "
                                                     f"{source.chunk_count} chunks"))
            else:
                self.stderr.write(self.style.ERROR(f"failed  #{source.pk} {source.title!r}: "
                                                   f"{source.ingest_error or source.ingest_status}"))
        return failures

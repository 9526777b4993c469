"""Writes for the knowledge base and the skill library."""

from __future__ import annotations

import ipaddress
import logging
from dataclasses import dataclass, field
from pathlib import Path

from django.core.files.base import ContentFile
from django.db import IntegrityError, transaction
from django.db.models import Max
from django.utils.text import get_valid_filename

from config.errors import Conflict, Invalid
from durable.models import DurableRun
from knowledge.conf import knowledge_settings
from knowledge.extraction import ExtractionError, detect_format
from knowledge.fetching import AddressPolicy
from knowledge.ingestion import content_hash
from knowledge.models import KnowledgeSource, Skill
from knowledge.skills import ParsedSkill, SkillFormatError, parse_skill

logger = logging.getLogger("knowledge.services")

SKILL_PACK_DIR = Path(__file__).resolve().parent / "skills"


class KnowledgeError(Invalid):
    """Bad input for a knowledge write; `field` names the offending input when there is one."""


class IngestInProgress(Conflict, KnowledgeError):
    """An ingest of a source asked for while one of it is running."""


# ------------------------------------------------------------------------------------------ sources


def _dedupe(workspace, digest: str) -> KnowledgeSource | None:
    return (KnowledgeSource.objects.filter(workspace=workspace, content_hash=digest)
            .exclude(ingest_status=KnowledgeSource.Status.FAILED).order_by("id").first())


def _chunking(chunk_size: int | None, chunk_overlap: int | None) -> None:
    if chunk_size is not None and not 200 <= chunk_size <= 20_000:
        raise KnowledgeError("chunk_size must be between 200 and 20000 characters", field="chunk_size")
    size = chunk_size or knowledge_settings().chunk_size
    if chunk_overlap is not None and not 0 <= chunk_overlap <= size // 2:
        raise KnowledgeError(f"chunk_overlap must be between 0 and half the chunk size ({size // 2})",
                             field="chunk_overlap")


@transaction.atomic
def source_create(*, workspace, text: str = "", url: str = "", upload=None, title: str = "", created_by=None,
                  chunk_size: int | None = None, chunk_overlap: int | None = None) -> tuple[KnowledgeSource, bool]:
    """A source from whichever of `text`, `url` or `upload` (an uploaded file) is given, in that order
    of preference; the shared entry point of the API and the admin. Returns (source, created)."""
    common = {"workspace": workspace, "title": title, "created_by": created_by, "chunk_size": chunk_size,
              "chunk_overlap": chunk_overlap}
    if text:
        return source_create_text(text=text, **common)
    if url:
        return source_create_url(url=url, **common)
    if upload is None:
        raise KnowledgeError("Give one of text, url or a file.")
    return source_create_file(name=upload.name, data=upload.read(),
                              content_type=getattr(upload, "content_type", "") or "", **common)


def source_create_text(*, workspace, text: str, title: str = "", created_by=None, chunk_size: int | None = None,
                       chunk_overlap: int | None = None) -> tuple[KnowledgeSource, bool]:
    """A source from text, ingested in the background. Returns (source, created): the same text
    already in the workspace returns the existing source, created False."""
    text = text.replace("\x00", "")
    if not text.strip():
        raise KnowledgeError("the text is empty", field="text")
    data = text.encode("utf-8")
    if len(data) > knowledge_settings().upload_max_bytes:
        raise KnowledgeError(f"the text is larger than {knowledge_settings().upload_max_bytes:,} bytes", field="text")
    _chunking(chunk_size, chunk_overlap)
    digest = content_hash(data)
    existing = _dedupe(workspace, digest)
    if existing is not None:
        return existing, False
    title = (title or "").strip() or _title_from_text(text)
    source = KnowledgeSource.objects.create(
        workspace=workspace, kind=KnowledgeSource.Kind.TEXT, title=title[:300], text=text, byte_size=len(data),
        content_hash="", created_by=created_by, chunk_size=chunk_size, chunk_overlap=chunk_overlap,
    )
    # the hash of content being ingested: a second identical upload finds this source at once
    KnowledgeSource.objects.filter(pk=source.pk).update(content_hash=digest)
    source.content_hash = digest
    source_ingest(source=source, force=True)
    return source, True


@transaction.atomic
def source_create_file(*, workspace, name: str, data: bytes, title: str = "", content_type: str = "",
                       created_by=None, chunk_size: int | None = None,
                       chunk_overlap: int | None = None) -> tuple[KnowledgeSource, bool]:
    """A source from an uploaded file (.txt .md .html .csv .pdf .docx, up to the upload limit),
    stored in the default storage and ingested in the background."""
    limit = knowledge_settings().upload_max_bytes
    if not data:
        raise KnowledgeError("the file is empty", field="file")
    if len(data) > limit:
        raise KnowledgeError(f"the file is {len(data):,} bytes, over the {limit:,}-byte limit", field="file")
    try:
        fmt = detect_format(data, filename=name, content_type=content_type)
    except ExtractionError as exc:
        raise KnowledgeError(str(exc), field="file") from None
    _chunking(chunk_size, chunk_overlap)
    digest = content_hash(data)
    existing = _dedupe(workspace, digest)
    if existing is not None:
        return existing, False
    safe_name = get_valid_filename(Path(name).name) or "upload"
    source = KnowledgeSource(
        workspace=workspace, kind=KnowledgeSource.Kind.FILE, title=(title or Path(name).stem or safe_name)[:300],
        uri=name[:2000], content_type=fmt, byte_size=len(data), created_by=created_by, chunk_size=chunk_size,
        chunk_overlap=chunk_overlap, content_hash=digest,
    )
    source.file.save(safe_name, ContentFile(data), save=False)
    source.save()
    source_ingest(source=source, force=True)
    return source, True


def validate_source_url(url: str) -> str:
    from knowledge.fetching import FetchError, _validate_url

    url = (url or "").strip()
    try:
        parts = _validate_url(url)
    except FetchError as exc:
        raise KnowledgeError(str(exc), field="url") from None
    try:
        literal = ipaddress.ip_address(parts.hostname)
    except ValueError:
        literal = None
    policy = AddressPolicy(allowed_networks=knowledge_settings().url_allowed_networks)
    if literal is not None and not policy.allows(str(literal)):
        raise KnowledgeError(f"{literal} is not a public address: only public web pages can be fetched", field="url")
    if parts.hostname.lower() in ("localhost", "localhost.localdomain") or parts.hostname.lower().endswith(
            (".localhost", ".internal", ".local")):
        raise KnowledgeError(f"{parts.hostname} is not a public host: only public web pages can be fetched",
                             field="url")
    return url


@transaction.atomic
def source_create_url(*, workspace, url: str, title: str = "", created_by=None, chunk_size: int | None = None,
                      chunk_overlap: int | None = None) -> tuple[KnowledgeSource, bool]:
    """A source from one web page, fetched and ingested in the background. The same URL in the
    workspace returns the existing source (re-ingest it to refresh it)."""
    url = validate_source_url(url)
    _chunking(chunk_size, chunk_overlap)
    existing = (KnowledgeSource.objects.filter(workspace=workspace, kind=KnowledgeSource.Kind.URL, uri=url)
                .order_by("id").first())
    if existing is not None:
        return existing, False
    source = KnowledgeSource.objects.create(
        workspace=workspace, kind=KnowledgeSource.Kind.URL, uri=url, title=(title or url)[:300],
        created_by=created_by, chunk_size=chunk_size, chunk_overlap=chunk_overlap,
    )
    source_ingest(source=source, force=True)
    return source, True


def _title_from_text(text: str) -> str:
    for line in text.splitlines():
        line = line.strip().lstrip("#").strip()
        if line:
            return line[:120]
    return "Untitled"


@transaction.atomic
def source_ingest(*, source: KnowledgeSource, force: bool = False, mode: str = "ingest") -> DurableRun:
    """Start the durable ingest of a source (`mode="reembed"`: re-embed its chunks with the
    configured model). Refused while another ingest of the source is running. Without `force`,
    content identical to what is indexed is not ingested again."""
    from durable.services import run_start
    from knowledge.durable_workflows import INGEST_WORKFLOW

    locked = KnowledgeSource.objects.select_for_update().select_related("workspace").get(pk=source.pk)
    if locked.ingest_status == KnowledgeSource.Status.PROCESSING and locked.ingest_run_id and \
            DurableRun.objects.filter(pk=locked.ingest_run_id, status__in=DurableRun.Status.ACTIVE).exists():
        raise IngestInProgress("this source is being ingested already; wait for it to finish")
    if mode == "reembed" and not locked.chunk_count:
        raise KnowledgeError("the source has no chunks to re-embed: ingest it instead")
    run = run_start(workflow=INGEST_WORKFLOW, input={"source_id": locked.pk, "mode": mode, "force": force},
                    namespace=locked.workspace.namespace, tags=["knowledge", mode])
    KnowledgeSource.objects.filter(pk=locked.pk).update(
        ingest_status=KnowledgeSource.Status.PROCESSING, ingest_error="", ingest_run=run)
    source.ingest_status, source.ingest_error, source.ingest_run = KnowledgeSource.Status.PROCESSING, "", run
    return run


def source_reembed(*, source: KnowledgeSource) -> DurableRun:
    """Re-embed a source's chunks with the configured embedding model (its text is not fetched again)."""
    return source_ingest(source=source, mode="reembed")


def workspace_reembed(*, workspace, stale_only: bool = True) -> list[DurableRun]:
    """Re-embed a workspace's indexed sources: those embedded with another model (default), or all."""
    sources = KnowledgeSource.objects.filter(workspace=workspace, ingest_status=KnowledgeSource.Status.INDEXED,
                                             chunk_count__gt=0)
    if stale_only:
        sources = sources.stale()
    runs = []
    for source in sources.order_by("id"):
        try:
            runs.append(source_reembed(source=source))
        except IngestInProgress:
            continue
    return runs


@transaction.atomic
def embedding_width_change(*, dimensions: int) -> int:
    """Give the stored vectors the width `dimensions` (EMBEDDING_DIMENSIONS changed); returns the old width.

    The chunks keep placeholder vectors (cut to the new width, or padded with zeros) and every indexed
    source is marked as embedded with another model (``<model>@<old width>``), so ``workspace_reembed``
    picks each up; staged vectors of unfinished ingests are dropped (their runs' batches embed again).
    One transaction: a crash leaves either the old width with nothing marked, or the new width with
    every source marked stale; the chunk indexes are rebuilt by the ALTER inside it."""
    from django.db import connection
    from django.db.models import F, Value
    from django.db.models.functions import Concat

    from knowledge.models import KnowledgeChunk, KnowledgeChunkStage
    from knowledge.selectors import embedding_column_width

    old = embedding_column_width()
    if old is None or old == dimensions:
        return old or dimensions
    if dimensions < old:
        placeholder = f"subvector(embedding, 1, {dimensions})::vector({dimensions})"
    else:
        placeholder = f"(embedding::real[] || array_fill(0::real, ARRAY[{dimensions - old}]))::vector({dimensions})"
    with connection.cursor() as cursor:
        stage, chunks = KnowledgeChunkStage._meta.db_table, KnowledgeChunk._meta.db_table
        cursor.execute(f"UPDATE {stage} SET embedding = NULL WHERE embedding IS NOT NULL")
        cursor.execute(f"ALTER TABLE {stage} ALTER COLUMN embedding TYPE vector({dimensions}) USING NULL")
        cursor.execute(f"ALTER TABLE {chunks} ALTER COLUMN embedding TYPE vector({dimensions}) USING {placeholder}")
    KnowledgeSource.objects.filter(ingest_status=KnowledgeSource.Status.INDEXED).update(
        embedding_model=Concat(F("embedding_model"), Value(f"@{old}")))
    return old


def source_delete(*, source: KnowledgeSource) -> None:
    """Delete a source, its chunks and its stored file; an ingest still running is cancelled."""
    from durable.services import run_cancel

    run_id = source.ingest_run_id
    name = source.file.name if source.file else ""
    with transaction.atomic():
        source.delete()
        if name:
            storage = source.file.storage
            transaction.on_commit(lambda: storage.delete(name))
    if run_id and DurableRun.objects.filter(pk=run_id, status__in=DurableRun.Status.ACTIVE).exists():
        try:
            run_cancel(run_id=run_id, reason="its knowledge source was deleted")
        except Exception:  # the run ending on its own meanwhile is fine: its steps find no source
            logger.info("could not cancel ingest run %s of a deleted source", run_id, exc_info=True)


# ------------------------------------------------------------------------------------------- skills


@dataclass
class SeedReport:
    created: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    pruned: list[str] = field(default_factory=list)
    errors: list[tuple[str, str]] = field(default_factory=list)  # (path, reason)
    warnings: list[tuple[str, str]] = field(default_factory=list)  # (path, what was accepted anyway)


@transaction.atomic
def skill_save(*, workspace, parsed: ParsedSkill, origin: str = Skill.Origin.API, source_path: str = "",
               created_by=None, activate: bool = True) -> tuple[Skill, str]:
    """Store a parsed skill: unchanged content (the latest version's hash) is skipped; new content
    becomes version max+1 and, with `activate`, the active version. Returns (skill, outcome) with
    outcome "created" (first version), "updated" or "skipped"."""
    # one writer per (workspace, name) at a time: the version numbering depends on it
    versions = Skill.objects.select_for_update().filter(workspace=workspace, name=parsed.name)
    latest = versions.order_by("-version").first()
    if latest is not None and latest.content_hash == parsed.content_hash:
        return latest, "skipped"
    number = (versions.aggregate(top=Max("version"))["top"] or 0) + 1
    if activate:
        versions.filter(active=True).update(active=False)
    try:
        with transaction.atomic():
            skill = Skill.objects.create(
                workspace=workspace, name=parsed.name, version=number, version_label=parsed.version_label,
                description=parsed.description, content_md=parsed.body, frontmatter=parsed.frontmatter,
                triggers=parsed.triggers, allowed_tools=parsed.allowed_tools, agent=parsed.agent, active=activate,
                content_hash=parsed.content_hash, origin=origin, source_path=source_path, created_by=created_by,
            )
    except IntegrityError:
        raise KnowledgeError(f"skill {parsed.name!r} was changed concurrently; try again", field="content") from None
    return skill, "created" if latest is None else "updated"


def skill_create_from_text(*, workspace, content: str, created_by=None, origin: str = Skill.Origin.API,
                           activate: bool = True) -> tuple[Skill, str]:
    try:
        parsed = parse_skill(content)
    except SkillFormatError as exc:
        raise KnowledgeError(str(exc), field="content") from None
    return skill_save(workspace=workspace, parsed=parsed, origin=origin, created_by=created_by, activate=activate)


@transaction.atomic
def skill_activate(*, skill: Skill) -> Skill:
    """Make this version the active one of its skill (the previously active one is deactivated)."""
    Skill.objects.select_for_update().filter(workspace_id=skill.workspace_id, name=skill.name, active=True) \
        .exclude(pk=skill.pk).update(active=False)
    Skill.objects.filter(pk=skill.pk).update(active=True)
    skill.active = True
    return skill


@transaction.atomic
def skill_deactivate(*, skill: Skill) -> Skill:
    Skill.objects.filter(pk=skill.pk).update(active=False)
    skill.active = False
    return skill


def skill_files(root: Path) -> list[Path]:
    """Every SKILL.md under `root` (a pack of skill folders), in a stable order."""
    return sorted(p for p in root.rglob("*") if p.is_file() and p.name.lower() == "skill.md")


def skills_seed(*, workspace, root: Path | None = None, dry_run: bool = False, prune: bool = False) -> SeedReport:
    """Seed a workspace's skill library from a pack directory (default: the pack Lineage ships).

    Idempotent: unchanged skills are skipped; changed ones become a new active version. A
    malformed file is reported with its path and reason, and the others are still seeded. With
    `prune`, active seeded skills whose folder is gone are deactivated (their versions stay).
    With `dry_run` nothing is written, and the report says what would have been.
    """
    root = Path(root or SKILL_PACK_DIR)
    report = SeedReport()
    seen: dict[str, str] = {}
    parsed_files: list[tuple[str, ParsedSkill]] = []
    for path in skill_files(root):
        relative = str(path.relative_to(root))
        try:
            parsed = parse_skill(path.read_text(encoding="utf-8"))
        except UnicodeDecodeError:
            report.errors.append((relative, "not UTF-8 text"))
            continue
        except SkillFormatError as exc:
            report.errors.append((relative, str(exc)))
            continue
        if parsed.name in seen:
            report.errors.append((relative, f"duplicate skill name {parsed.name!r} (also in {seen[parsed.name]})"))
            continue
        seen[parsed.name] = relative
        report.warnings.extend((relative, warning) for warning in parsed.warnings)
        parsed_files.append((relative, parsed))

    try:
        with transaction.atomic():  # a dry run raises at the end: everything it wrote is rolled back
            for relative, parsed in parsed_files:
                _skill, outcome = skill_save(workspace=workspace, parsed=parsed, origin=Skill.Origin.SEED,
                                             source_path=relative)
                getattr(report, outcome).append(parsed.name)
            if prune:
                stale = Skill.objects.filter(workspace=workspace, active=True, origin=Skill.Origin.SEED) \
                    .exclude(name__in=list(seen))
                report.pruned = sorted(stale.values_list("name", flat=True))
                stale.update(active=False)
            if dry_run:
                raise _DryRun
    except _DryRun:
        pass
    return report


class _DryRun(Exception):  # not an error: raised to roll a dry run back
    pass

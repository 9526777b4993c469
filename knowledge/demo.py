"""Demo data for `manage.py seed_demo`: the skill pack and a small knowledge base, in the demo
workspace. Idempotent: unchanged skills and identical documents are skipped."""

from __future__ import annotations

from pathlib import Path

from knowledge import services
from knowledge.models import KnowledgeSource
from workspaces.demo import demo_workspace

CORPUS_DIR = Path(__file__).resolve().parent / "corpus"
DEMO_CHUNK_SIZE = 300  # small chunks, so the small corpus makes a searchable few hundred passages
DEMO_CHUNK_OVERLAP = 50


def _documents() -> list[tuple[str, str]]:
    documents = []
    for path in sorted(CORPUS_DIR.glob("*.md")):
        if path.name.lower() == "readme.md":
            continue
        text = path.read_text(encoding="utf-8")
        title = next((line.lstrip("# ").strip() for line in text.splitlines() if line.startswith("# ")), path.stem)
        documents.append((title, text))
    for path in services.skill_files(services.SKILL_PACK_DIR):
        documents.append((f"Skill: {path.parent.name}", path.read_text(encoding="utf-8")))
    return documents


def seed(stdout) -> None:
    from durable.inprocess import run_until_settled  # drives the ingest here, so the demo works before workers start

    workspace = demo_workspace()
    report = services.skills_seed(workspace=workspace)
    stdout.write(f"knowledge: skills in {workspace.slug!r}: {len(report.created)} created, "
                 f"{len(report.updated)} updated, {len(report.skipped)} unchanged")
    for path, reason in report.errors:
        stdout.write(f"knowledge: malformed skill {path}: {reason}")
    created = indexed = 0
    for title, text in _documents():
        source, is_new = services.source_create_text(workspace=workspace, text=text, title=title,
                                                     chunk_size=DEMO_CHUNK_SIZE, chunk_overlap=DEMO_CHUNK_OVERLAP)
        if is_new or source.ingest_status != KnowledgeSource.Status.INDEXED:
            if not is_new and source.ingest_status == KnowledgeSource.Status.FAILED:
                services.source_ingest(source=source, force=True)
                source.refresh_from_db()
            if source.ingest_run_id:
                run_until_settled(source.ingest_run_id, max_wait=120)
            created += is_new
        source.refresh_from_db()
        indexed += source.ingest_status == KnowledgeSource.Status.INDEXED
    chunks = sum(KnowledgeSource.objects.filter(workspace=workspace).values_list("chunk_count", flat=True))
    stdout.write(f"knowledge: {created} new document(s); {indexed} indexed, {chunks} chunks in {workspace.slug!r}")

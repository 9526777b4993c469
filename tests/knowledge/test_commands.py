from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from knowledge import demo
from knowledge.models import KnowledgeSource, Skill
from knowledge.search import knowledge_search
from tests.factories import UserFactory
from tests.knowledge.fixtures import make_pdf
from workspaces.models import Membership, Workspace

pytestmark = pytest.mark.django_db


def test_ingest_command_walks_files_and_directories(workspace, tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("# Alpha\n\nLeases are renewed at half their length.")
    (tmp_path / "docs" / "b.pdf").write_bytes(make_pdf([["Schedules fire once per window."]]))
    (tmp_path / "docs" / "ignored.bin").write_bytes(b"\x00\x01")
    (tmp_path / "broken.pdf").write_bytes(b"%PDF-1.4 broken")
    out, err = StringIO(), StringIO()
    with pytest.raises(CommandError, match="1 target"):
        call_command("ingest", str(tmp_path / "docs"), str(tmp_path / "broken.pdf"), "--workspace", "acme",
                     stdout=out, stderr=err)
    assert "3/3" in out.getvalue()  # the progress bar reached the end
    assert "indexed" in out.getvalue() and "could not read the PDF" in err.getvalue()
    assert set(KnowledgeSource.objects.values_list("ingest_status", flat=True)) == {"indexed", "failed"}
    out = StringIO()
    call_command("ingest", str(tmp_path / "docs" / "a.md"), "--workspace", "acme", stdout=out)
    assert "unchanged, already source" in out.getvalue()


def test_ingest_command_errors(workspace):
    with pytest.raises(CommandError, match="No workspace"):
        call_command("ingest", "x.txt", "--workspace", "nope")
    with pytest.raises(CommandError, match="no such file"):
        call_command("ingest", "/nonexistent/file.txt", "--workspace", "acme")


def test_demo_seed_is_idempotent_and_searchable():
    admin = UserFactory(username="admin", is_superuser=True, is_staff=True)
    out = StringIO()
    demo.seed(stdout=out)
    workspace = Workspace.objects.get(slug="demo")
    assert Membership.objects.filter(workspace=workspace, user=admin, role="owner").exists()
    sources = KnowledgeSource.objects.filter(workspace=workspace)
    assert sources.count() >= 20 and set(sources.values_list("ingest_status", flat=True)) == {"indexed"}
    chunks = sum(s.chunk_count for s in sources)
    assert chunks >= 300  # "a few hundred chunks"
    assert Skill.objects.filter(workspace=workspace, active=True).count() >= 7
    before = (sources.count(), Skill.objects.count())
    demo.seed(stdout=StringIO())
    assert (KnowledgeSource.objects.filter(workspace=workspace).count(), Skill.objects.count()) == before
    hits = knowledge_search(workspace=workspace, query="what happens when a worker crashes", k=3).hits
    assert any("crash" in h.content.lower() for h in hits)


def _chunk_indexes() -> set[str]:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT indexname FROM pg_indexes WHERE tablename = 'knowledge_knowledgechunk'")
        return {row[0] for row in cursor.fetchall()}


@pytest.mark.django_db(transaction=True)
def test_ingest_command_bulk_mode_rebuilds_the_indexes(tmp_path):
    ws = Workspace.objects.create(name="Bulk", slug="bulk")
    before = _chunk_indexes()
    assert {"knowledge_chunk_search_gin", "knowledge_chunk_embedding_hnsw"} <= before
    (tmp_path / "a.md").write_text("# Alpha\n\nLeases are renewed at half their length.")
    (tmp_path / "b.txt").write_text("Schedules fire exactly once per window, even after a restart.")
    out = StringIO()
    call_command("ingest", str(tmp_path), "--workspace", "bulk", "--bulk", stdout=out)
    assert "indexes rebuilt" in out.getvalue()
    assert _chunk_indexes() == before
    assert set(KnowledgeSource.objects.filter(workspace=ws).values_list("ingest_status", flat=True)) == {"indexed"}
    hits = knowledge_search(workspace=ws, query="schedules window", mode="fulltext").hits
    assert hits and "Schedules" in hits[0].content
    # an interrupted bulk load leaves indexes missing: --restore-indexes puts them back
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("DROP INDEX knowledge_chunk_search_gin")
    out = StringIO()
    call_command("ingest", "--restore-indexes", stdout=out)
    assert "built knowledge_chunk_search_gin" in out.getvalue() and _chunk_indexes() == before
    with pytest.raises(CommandError, match="background"):
        call_command("ingest", str(tmp_path), "--workspace", "bulk", "--bulk", "--background")


def test_vectors_of_another_width_are_refused_at_start_naming_the_reembed_command(settings):
    from knowledge.checks import embedding_width_check

    assert embedding_width_check(databases=["default"]) == []
    settings.EMBEDDING_DIMENSIONS = 128  # the operator changed the model's width; the column has the old one
    (error,) = embedding_width_check(databases=["default"])
    assert error.id == "knowledge.E001" and "EMBEDDING_DIMENSIONS is 128" in error.msg
    assert "manage.py knowledge reembed" in error.hint
    assert embedding_width_check(databases=None) == []  # only where the database checks run (migrate)


def test_reembed_moves_the_vectors_to_the_new_width_and_restarts_each_stale_source(workspace, settings):
    """A change of embedding width: the column takes the new width and every indexed source, now
    stale, gets a durable re-embed run. (No chunk rows here: pgvector's distance code, which the HNSW
    index runs on every insert, needs CPU instructions some machines lack.)"""
    from knowledge.selectors import embedding_column_width
    from tests.factories import KnowledgeSourceFactory

    width = embedding_column_width()
    assert width == settings.EMBEDDING_DIMENSIONS
    fresh = KnowledgeSourceFactory(workspace=workspace, chunk_count=3)
    KnowledgeSourceFactory(workspace=workspace, chunk_count=0)  # nothing to re-embed: ingest it instead
    settings.EMBEDDING_DIMENSIONS = 128
    # the column is every workspace's: re-embedding one would leave the others searching placeholder vectors
    with pytest.raises(CommandError, match="re-embeds every workspace; run it without --workspace"):
        call_command("knowledge", "reembed", "--workspace", workspace.slug)
    assert embedding_column_width() == width
    out = StringIO()
    call_command("knowledge", "reembed", "--background", stdout=out)
    assert embedding_column_width() == 128
    assert f"moved from {width} to 128 dimensions" in out.getvalue() and "acme: 1 source(s)" in out.getvalue()
    fresh.refresh_from_db()
    assert fresh.ingest_status == "processing" and fresh.ingest_run.workflow == "knowledge.ingest_source"
    assert "reembed" in fresh.ingest_run.tags
    assert fresh.embedding_model == f"{settings.EMBEDDING_MODEL}@{width}"  # stale until its run finishes
    with pytest.raises(CommandError, match="No workspace with the slug 'nope'"):
        call_command("knowledge", "reembed", "--workspace", "nope")

"""Ingestion as a durable workflow, driven in-process with durable.inprocess.run_until_settled."""

import numpy as np
import pytest
from django.conf import settings as django_settings
from django.core.files.base import ContentFile

from durable.codec import decode
from durable.models import DurableRun, StepCheckpoint
from knowledge import ingestion, services
from knowledge.models import KnowledgeChunk, KnowledgeChunkStage, KnowledgeSource
from llm.embeddings import OfflineEmbeddingProvider, TransientEmbeddingError, WordLlamaEmbeddingProvider
from tests.knowledge.fixtures import HTML_PAGE, make_docx, make_pdf
from tests.local_server import LocalServer

pytestmark = pytest.mark.django_db

PARAGRAPHS = [f"Paragraph {i}: the durable engine checkpoints step {i} in Postgres before moving on."
              for i in range(40)]
TEXT = "\n\n".join(PARAGRAPHS)


def test_text_source_is_chunked_embedded_and_indexed(workspace, ingest):
    source, created = services.source_create_text(workspace=workspace, text=TEXT, title="Engine notes",
                                                  chunk_size=300, chunk_overlap=50)
    assert created and source.ingest_status == "processing"
    source, run = ingest(source)
    assert run.status == DurableRun.Status.COMPLETED, run.error
    output = decode(run.output)
    assert output["status"] == "indexed"
    assert source.ingest_status == KnowledgeSource.Status.INDEXED
    assert source.ingest_error == ""
    chunks = list(KnowledgeChunk.objects.filter(source=source).order_by("ordinal"))
    assert source.chunk_count == len(chunks) > 5
    assert [c.ordinal for c in chunks] == list(range(len(chunks)))
    assert all(len(c.content) <= 300 and c.workspace_id == workspace.pk for c in chunks)
    assert source.token_count == sum(c.token_count for c in chunks)
    # the default offline model is the local wordllama one
    assert source.embedding_model == "wordllama-l2-supercat" and source.embedding_tokens > 0
    expected = WordLlamaEmbeddingProvider(dimensions=256).embed_query(chunks[3].content)
    assert np.allclose(np.asarray(chunks[3].embedding), expected, atol=1e-6)
    assert not KnowledgeChunkStage.objects.exists()  # the stage is emptied by the swap
    assert run.namespace == workspace.namespace
    assert source.ingest_run_id == run.pk


def test_each_embedding_batch_is_its_own_queued_step(settings, workspace, ingest):
    settings.KNOWLEDGE_INGEST_BATCH_CHUNKS = 4
    source, _ = services.source_create_text(workspace=workspace, text=TEXT, chunk_size=300, chunk_overlap=0)
    source, run = ingest(source)
    steps = StepCheckpoint.objects.filter(run=run, name__startswith="embed:")
    assert steps.count() == -(-source.chunk_count // 4)
    assert set(steps.values_list("queue", flat=True)) == {"ingest"}
    assert list(StepCheckpoint.objects.filter(run=run).exclude(name__startswith="embed:")
                .order_by("seq").values_list("name", flat=True)) == ["prepare", "finalize", "vector_index"]


@pytest.mark.parametrize(("name", "data", "expected"), [
    ("notes.md", b"# Runbook\n\nRestart the worker with care.\n\nCheck the lease first.", "Restart the worker"),
    ("notes.txt", b"Plain text notes about retention policies.", "retention policies"),
    ("page.html", HTML_PAGE.encode(), "checkpointed in Postgres"),
    ("bugs.csv", b"title,severity\nLogin down,P0\n", "title: Login down; severity: P0"),
    ("guide.pdf", make_pdf([["Leases are renewed at half their length."]]), "Leases are renewed"),
    ("guide.docx", make_docx(["Schedules fire once per window."]), "Schedules fire once"),
])
def test_file_sources_of_every_format(workspace, ingest, name, data, expected):
    source, created = services.source_create_file(workspace=workspace, name=name, data=data)
    assert created and source.file.name.startswith("knowledge/")
    source, _run = ingest(source)
    assert source.ingest_status == "indexed", source.ingest_error
    assert expected in " ".join(source.chunks.values_list("content", flat=True))
    assert source.content_type and source.byte_size == len(data)


def test_identical_content_is_not_ingested_twice(workspace, ingest):
    source, _ = services.source_create_text(workspace=workspace, text=TEXT)
    source, _ = ingest(source)
    chunk_ids = set(source.chunks.values_list("id", flat=True))
    again, created = services.source_create_text(workspace=workspace, text=TEXT, title="Same again")
    assert not created and again.pk == source.pk
    # re-ingesting the unchanged source is a no-op: same chunks, nothing embedded
    run = services.source_ingest(source=source)
    source, run = ingest(source)
    assert decode(run.output) == {"status": "unchanged"}
    assert set(source.chunks.values_list("id", flat=True)) == chunk_ids
    assert not StepCheckpoint.objects.filter(run=run, name__startswith="embed:").exists()
    # the same bytes as a file are the same content too
    dup, created = services.source_create_file(workspace=workspace, name="copy.txt", data=TEXT.encode())
    assert not created and dup.pk == source.pk


def test_changed_content_replaces_the_chunks_in_one_swap(workspace, ingest):
    with LocalServer("127.0.0.2") as server:
        server.routes["/doc"] = (200, {"Content-Type": "text/plain"}, "First version about leases.")
        from django.test import override_settings

        with override_settings(KNOWLEDGE_URL_ALLOWED_NETWORKS=["127.0.0.2/32"]):
            source, _ = services.source_create_url(workspace=workspace, url=server.url("/doc"))
            source, _ = ingest(source)
            assert source.ingest_status == "indexed", source.ingest_error
            first = list(source.chunks.values_list("content", flat=True))
            server.routes["/doc"] = (200, {"Content-Type": "text/plain"}, "Second version about schedules.")
            services.source_ingest(source=source)
            source, run = ingest(source)
    assert decode(run.output)["status"] == "indexed"
    assert first == ["First version about leases."]
    assert list(source.chunks.values_list("content", flat=True)) == ["Second version about schedules."]


def test_url_source_takes_the_page_title(workspace, ingest, settings):
    settings.KNOWLEDGE_URL_ALLOWED_NETWORKS = ["127.0.0.2/32"]
    with LocalServer("127.0.0.2") as server:
        server.routes["/handbook"] = (200, {"Content-Type": "text/html"}, HTML_PAGE)
        source, _ = services.source_create_url(workspace=workspace, url=server.url("/handbook"))
        source, _ = ingest(source)
    assert source.ingest_status == "indexed", source.ingest_error
    assert source.title == "Durable engine handbook"
    assert "Navigation link" not in " ".join(source.chunks.values_list("content", flat=True))


def test_url_redirecting_to_a_private_address_fails_the_source(workspace, ingest, settings):
    settings.KNOWLEDGE_URL_ALLOWED_NETWORKS = ["127.0.0.2/32"]
    with LocalServer("127.0.0.2") as server:
        server.routes["/start"] = (302, {"Location": "http://127.0.0.1:9/secret"}, "")
        source, _ = services.source_create_url(workspace=workspace, url=server.url("/start"))
        source, run = ingest(source)
    assert source.ingest_status == KnowledgeSource.Status.FAILED
    assert "127.0.0.1, which is not a public address" in source.ingest_error
    assert run.status == DurableRun.Status.FAILED
    assert not source.chunks.exists()
    # a permanent refusal does not burn retries
    assert StepCheckpoint.objects.get(run=run, name="prepare").attempt == 1


def test_unreadable_file_is_recorded_on_the_source(workspace, ingest):
    source = KnowledgeSource.objects.create(workspace=workspace, kind="file", title="broken", uri="broken.pdf")
    source.file.save("broken.pdf", ContentFile(b"%PDF-1.4 not a real pdf"), save=True)
    services.source_ingest(source=source)
    source, run = ingest(source)
    assert source.ingest_status == "failed"
    assert source.ingest_error.startswith("could not read the PDF")
    assert run.status == "failed"


def test_too_many_chunks_fails_with_the_limit_named(workspace, ingest, settings):
    settings.KNOWLEDGE_MAX_CHUNKS_PER_SOURCE = 3
    source, _ = services.source_create_text(workspace=workspace, text=TEXT, chunk_size=200, chunk_overlap=0)
    source, _ = ingest(source)
    assert source.ingest_status == "failed"
    assert "over the limit of 3 (KNOWLEDGE_MAX_CHUNKS_PER_SOURCE)" in source.ingest_error


class FlakyProvider(OfflineEmbeddingProvider):
    """Fails the first `failures` calls on texts containing `poison`."""

    def __init__(self, poison: str, failures: int):
        super().__init__(dimensions=django_settings.EMBEDDING_DIMENSIONS)
        self.poison, self.failures, self.calls = poison, failures, []

    def _embed(self, texts):
        self.calls.append(len(texts))
        if any(self.poison in t for t in texts) and self.failures:
            self.failures -= 1
            raise TransientEmbeddingError("rate limited")
        return super()._embed(texts)


def test_a_failed_batch_is_retried_alone(workspace, ingest, settings, monkeypatch):
    settings.KNOWLEDGE_INGEST_BATCH_CHUNKS = 2
    flaky = FlakyProvider("Paragraph 7:", failures=2)
    monkeypatch.setattr(ingestion, "get_embedding_provider", lambda: flaky)
    source, _ = services.source_create_text(workspace=workspace, text=TEXT, chunk_size=200, chunk_overlap=0)
    source, run = ingest(source)
    assert source.ingest_status == "indexed", source.ingest_error
    attempts = dict(StepCheckpoint.objects.filter(run=run, name__startswith="embed:").values_list("name", "attempt"))
    retried = {name for name, attempt in attempts.items() if attempt > 1}
    assert len(retried) == 1 and attempts[retried.pop()] == 3
    assert sum(flaky.calls) == source.chunk_count + 2 * 2  # only the failing batch was embedded again
    assert KnowledgeChunk.objects.filter(source=source).count() == source.chunk_count


def test_a_batch_failing_for_good_fails_the_source_and_keeps_the_old_chunks(workspace, ingest, settings,
                                                                            monkeypatch):
    source, _ = services.source_create_text(workspace=workspace, text="Old content about leases.")
    source, _ = ingest(source)
    old = list(source.chunks.values_list("id", flat=True))
    monkeypatch.setattr(ingestion, "get_embedding_provider", lambda: FlakyProvider("leases", failures=99))
    services.source_ingest(source=source, force=True)
    source, run = ingest(source)
    assert run.status == "failed"
    assert source.ingest_status == "failed"
    assert "embedding batch 0 failed after its retries" in source.ingest_error
    assert "rate limited" in source.ingest_error
    assert list(source.chunks.values_list("id", flat=True)) == old  # still searchable
    assert not KnowledgeChunkStage.objects.exists()


def test_reembed_after_the_model_changed(workspace, ingest, settings):
    source, _ = services.source_create_text(workspace=workspace, text=TEXT, chunk_size=400)
    source, _ = ingest(source)
    contents = list(source.chunks.order_by("ordinal").values_list("content", flat=True))
    settings.EMBEDDING_MODEL = "offline-hash-v1"
    assert source.needs_reembed
    assert list(KnowledgeSource.objects.stale()) == [source]
    runs = services.workspace_reembed(workspace=workspace)
    assert len(runs) == 1
    source, run = ingest(source)
    assert decode(run.output)["status"] == "indexed"
    assert source.embedding_model == "offline-hash-v1" and not source.needs_reembed
    assert list(source.chunks.order_by("ordinal").values_list("content", flat=True)) == contents


def test_a_second_ingest_while_one_runs_is_refused(workspace):
    source, _ = services.source_create_text(workspace=workspace, text=TEXT)
    with pytest.raises(services.IngestInProgress):
        services.source_ingest(source=source)


def test_deleting_a_source_mid_ingest_cancels_the_run(workspace, ingest):
    source, _ = services.source_create_text(workspace=workspace, text=TEXT)
    run_id = source.ingest_run_id
    services.source_delete(source=source)
    assert DurableRun.objects.get(pk=run_id).status == DurableRun.Status.CANCELLED
    assert not KnowledgeChunk.objects.exists()


def _steps(source, run_key):
    prepared = ingestion.ingest_prepare(source.pk, run_key)
    assert ingestion.ingest_prepare(source.pk, run_key) == prepared
    assert KnowledgeChunkStage.objects.filter(run_key=run_key).count() == prepared["chunks"]
    args = (source.pk, run_key, 0, 1000, prepared["direct"], prepared["workspace_id"])
    batch = ingestion.ingest_embed_batch(*args)
    assert batch["embedded"] == prepared["chunks"]
    assert ingestion.ingest_embed_batch(*args)["embedded"] == 0  # nothing left to pay for
    done = ingestion.ingest_finalize(source.pk, run_key, prepared, batch["usage"])
    assert done["chunks"] == prepared["chunks"] == KnowledgeChunk.objects.filter(source=source).count()
    assert not KnowledgeChunkStage.objects.exists()
    return prepared


def test_steps_are_idempotent_on_a_first_ingest_and_on_a_swap(workspace):
    """Run each step twice, as at-least-once execution may: the outcome is the same."""
    source = KnowledgeSource.objects.create(workspace=workspace, kind="text", title="t", text=TEXT)
    assert _steps(source, "run-a")["direct"] is True  # no chunks yet: batches write the final rows
    first = set(source.chunks.values_list("id", flat=True))
    KnowledgeSource.objects.filter(pk=source.pk).update(text=TEXT + "\n\nOne more paragraph.")
    source.refresh_from_db()
    assert _steps(source, "run-b")["direct"] is False  # chunks exist: staged, then swapped
    assert not first & set(source.chunks.values_list("id", flat=True))


def test_a_failed_first_ingest_leaves_no_partial_chunks(workspace, ingest, settings, monkeypatch):
    settings.KNOWLEDGE_INGEST_BATCH_CHUNKS = 2
    monkeypatch.setattr(ingestion, "get_embedding_provider", lambda: FlakyProvider("Paragraph 30:", failures=99))
    source, _ = services.source_create_text(workspace=workspace, text=TEXT, chunk_size=200, chunk_overlap=0)
    source, run = ingest(source)
    assert source.ingest_status == "failed" and run.status == "failed"
    assert not source.chunks.exists()


def test_empty_text_is_refused_up_front(workspace):
    with pytest.raises(services.KnowledgeError, match="empty") as caught:
        services.source_create_text(workspace=workspace, text="  \n ")
    assert caught.value.field == "text"

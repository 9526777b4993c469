"""The ingestion pipeline's steps: prepare (fetch, extract, chunk, stage), embed one batch,
finalize (swap the staged chunks in), and record a failure.

Each function is module-level and takes JSON arguments, because the durable workflow in
``knowledge/durable_workflows.py`` runs them as steps, some on Celery workers. Each is safe to
run twice (steps are executed at least once): prepare rewrites the stage of its run, a batch
embeds only the staged rows still missing an embedding, and finalize runs inside the engine's
``ctx.transaction`` so its swap and its checkpoint commit together.

Permanent problems (an unsupported file, a refused address, a document with too many chunks)
come back as ``{"error": ...}`` instead of raising, so they do not burn retries meant for
transient ones (a timeout, a rate limit, a lost connection).
"""

from __future__ import annotations

import hashlib
import logging
import weakref
from dataclasses import dataclass

import numpy as np
from django.db import connection, transaction
from django.utils import timezone
from pgvector.psycopg import register_vector

from knowledge.chunking import chunk_text
from knowledge.conf import knowledge_settings
from knowledge.extraction import ExtractionError, extract
from knowledge.fetching import AddressPolicy, FetchError, fetch_url
from knowledge.models import KnowledgeChunk, KnowledgeChunkStage, KnowledgeSource
from llm.embeddings import EmbeddingError, TransientEmbeddingError, get_embedding_provider
from llm.usage import Usage, estimate_tokens
from workspaces.models import Workspace

logger = logging.getLogger("knowledge.ingestion")

STAGE_TABLE = KnowledgeChunkStage._meta.db_table
CHUNK_TABLE = KnowledgeChunk._meta.db_table
SOURCE_TABLE = KnowledgeSource._meta.db_table


class IngestError(ValueError):
    """A permanent ingestion problem, reported on the source."""


@dataclass(frozen=True)
class Content:
    data: bytes
    content_type: str = ""
    filename: str = ""
    url: str = ""


# ------------------------------------------------------------------------------------------ content


def content_hash(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def url_policy() -> AddressPolicy:
    return AddressPolicy(allowed_networks=knowledge_settings().url_allowed_networks)


def source_content(source: KnowledgeSource) -> Content:
    """The raw bytes of a source: its text, its stored file, or its URL fetched now."""
    conf = knowledge_settings()
    if source.kind == KnowledgeSource.Kind.TEXT:
        return Content(source.text.encode("utf-8"), "text/markdown" if _looks_markdown(source.text) else "text/plain")
    if source.kind == KnowledgeSource.Kind.FILE:
        if not source.file:
            raise IngestError("the source has no stored file")
        try:
            with source.file.open("rb") as handle:
                data = handle.read(conf.upload_max_bytes + 1)
        except FileNotFoundError:
            raise IngestError("the stored file is missing; upload it again") from None
        if len(data) > conf.upload_max_bytes:
            raise IngestError(f"the file is larger than the {conf.upload_max_bytes:,}-byte limit")
        return Content(data, filename=source.uri or source.file.name)
    page = fetch_url(source.uri, timeout=conf.url_timeout_seconds, max_bytes=conf.url_max_bytes,
                     policy=url_policy())
    return Content(page.body, content_type=page.content_type, filename=_url_filename(page.url), url=page.url)


def _url_filename(url: str) -> str:
    from urllib.parse import urlsplit

    from knowledge.extraction import EXTENSIONS

    name = urlsplit(url).path.rsplit("/", 1)[-1]
    # a known extension helps (a .md served as text/plain); others (.php, .aspx) say nothing
    return name if "." in name and "." + name.rsplit(".", 1)[-1].lower() in EXTENSIONS else ""


def _looks_markdown(text: str) -> bool:
    return any(line.startswith(("# ", "## ", "- ", "* ", "```")) for line in text[:5000].splitlines())


# --------------------------------------------------------------------------------------- copy helper

_registered: weakref.WeakSet = weakref.WeakSet()


def raw_connection():
    """Django's psycopg connection, with pgvector's binary dumpers registered once per connection."""
    connection.ensure_connection()
    raw = connection.connection
    if raw not in _registered:
        register_vector(raw)
        _registered.add(raw)
    return raw


def copy_rows(table: str, columns: list[str], types: list[str], rows) -> int:
    """Binary COPY of `rows` (tuples in `columns` order) into `table` on Django's connection."""
    raw = raw_connection()
    count = 0
    with raw.cursor() as cursor, cursor.copy(
        f"COPY {table} ({', '.join(columns)}) FROM STDIN WITH (FORMAT BINARY)"
    ) as copy:
        copy.set_types(types)
        for row in rows:
            copy.write_row(row)
            count += 1
    return count


def copy_stage_rows(rows) -> int:
    """COPY (run_key, source_id, ordinal, content, token_count) rows into the stage table."""
    return copy_rows(STAGE_TABLE, ["run_key", "source_id", "ordinal", "content", "token_count"],
                     ["text", "int8", "int4", "text", "int4"], rows)


# -------------------------------------------------------------------------------------------- steps


def ingest_prepare(source_id: int, run_key: str, mode: str = "ingest", force: bool = False,
                   namespace: str | None = None) -> dict:
    """Step 1: fetch or read the content, extract its text, chunk it and stage the chunks.

    Returns {"chunks", "batches", ...}, {"unchanged": True} when the content is the one already
    indexed (and `force` is off), {"deleted": True} when the source is gone, {"refused": ...} when
    the source is not in the run's workspace (`namespace`), or {"error": ...}.
    """
    source = KnowledgeSource.objects.filter(pk=source_id).first()
    if source is None:
        return {"deleted": True}
    if namespace is not None and namespace != Workspace.namespace_of(source.workspace_id):
        return {"refused": f"source {source_id} is not in this run's workspace"}
    conf = knowledge_settings()
    if mode == "reembed":
        return _prepare_reembed(source, run_key, conf)
    try:
        content = source_content(source)
        digest = content_hash(content.data)
        if (not force and digest == source.content_hash and source.chunk_count
                and source.embedding_model == conf.embedding_model
                and KnowledgeChunk.objects.filter(source_id=source_id).exists()):
            return {"unchanged": True, "content_hash": digest}
        extracted = extract(content.data, filename=content.filename, content_type=content.content_type)
        size = source.chunk_size or conf.chunk_size
        overlap = source.chunk_overlap if source.chunk_overlap is not None else conf.chunk_overlap
        chunks = chunk_text(extracted.text, size=size, overlap=overlap)
        if len(chunks) > conf.max_chunks_per_source:
            raise IngestError(f"the document makes {len(chunks):,} chunks, over the limit of "
                              f"{conf.max_chunks_per_source:,} (KNOWLEDGE_MAX_CHUNKS_PER_SOURCE)")
    except FetchError as exc:
        if getattr(exc, "transient", False):
            raise
        return {"error": str(exc)}
    except (ExtractionError, IngestError) as exc:
        return {"error": str(exc)}
    with transaction.atomic():
        KnowledgeChunkStage.objects.filter(source_id=source_id).delete()  # abandoned runs' and our own retry's
        copy_stage_rows((run_key, source_id, ordinal, text, estimate_tokens(text))
                        for ordinal, text in enumerate(chunks))
    return {
        # a source without chunks has nothing to swap out: its batches write the final rows directly
        "direct": not KnowledgeChunk.objects.filter(source_id=source_id).exists(),
        "workspace_id": source.workspace_id,
        "chunks": len(chunks),
        "batches": -(-len(chunks) // conf.ingest_batch_chunks),
        "batch_size": conf.ingest_batch_chunks,
        "content_hash": digest,
        "content_type": extracted.content_type,
        "title": extracted.title,
        "byte_size": len(content.data),
        "url": content.url,
    }


def _prepare_reembed(source: KnowledgeSource, run_key: str, conf) -> dict:
    with transaction.atomic():
        KnowledgeChunkStage.objects.filter(source_id=source.pk).delete()
        with connection.cursor() as cursor:
            cursor.execute(
                f"INSERT INTO {STAGE_TABLE} (run_key, source_id, ordinal, content, token_count) "
                f"SELECT %s, source_id, ordinal, content, token_count FROM {CHUNK_TABLE} WHERE source_id = %s",
                [run_key, source.pk],
            )
            count = cursor.rowcount
    if not count:
        return {"error": "the source has no chunks to re-embed: ingest it instead"}
    return {"direct": False, "workspace_id": source.workspace_id,
            "chunks": count, "batches": -(-count // conf.ingest_batch_chunks), "batch_size": conf.ingest_batch_chunks,
            "content_hash": source.content_hash, "content_type": source.content_type, "title": "",
            "byte_size": source.byte_size, "url": ""}


def ingest_embed_batch(source_id: int, run_key: str, batch: int, batch_size: int, direct: bool = False,
                       workspace_id: int | None = None) -> dict:
    """Step 2 (one per batch, on the ingest queue): embed the staged chunks of one batch.

    Only chunks not embedded yet are embedded, so a retried batch does not pay twice. For a
    source's first ingest (`direct`) the batch writes its final chunk rows at once; otherwise the
    embeddings wait in the stage for finalize's swap."""
    start, stop = batch * batch_size, (batch + 1) * batch_size
    done = (f"AND NOT EXISTS (SELECT 1 FROM {CHUNK_TABLE} c WHERE c.source_id = s.source_id "
            "AND c.ordinal = s.ordinal)") if direct else "AND s.embedding IS NULL"
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT s.id, s.ordinal, s.content, s.token_count FROM {STAGE_TABLE} s WHERE s.run_key = %s "
            f"AND s.ordinal >= %s AND s.ordinal < %s {done} ORDER BY s.ordinal",
            [run_key, start, stop],
        )
        rows = cursor.fetchall()
    if not rows:
        return {"batch": batch, "embedded": 0, "usage": Usage().as_dict()}
    provider = get_embedding_provider()
    try:
        result = provider.embed([row[2] for row in rows])
    except TransientEmbeddingError:
        raise  # retried by the engine
    except EmbeddingError as exc:
        return {"batch": batch, "error": str(exc)}
    if direct:
        with transaction.atomic():
            copy_rows(CHUNK_TABLE, ["source_id", "workspace_id", "ordinal", "content", "token_count", "embedding"],
                      ["int8", "int8", "int4", "text", "int4", "vector"],
                      ((source_id, workspace_id, ordinal, content, tokens, vector)
                       for (_id, ordinal, content, tokens), vector in zip(rows, result.vectors, strict=True)))
    else:
        write_stage_embeddings([row[0] for row in rows], result.vectors)
    return {"batch": batch, "embedded": len(rows), "usage": result.usage.as_dict()}


def write_stage_embeddings(ids: list[int], vectors: np.ndarray) -> None:
    """Set the embeddings of staged rows: one binary COPY into a temporary table, one UPDATE."""
    raw = raw_connection()
    with transaction.atomic(), raw.cursor() as cursor:
        cursor.execute(
            "CREATE TEMP TABLE IF NOT EXISTS knowledge_stage_vectors (id bigint, embedding vector) "
            "ON COMMIT DELETE ROWS"
        )
        with cursor.copy("COPY knowledge_stage_vectors (id, embedding) FROM STDIN WITH (FORMAT BINARY)") as copy:
            copy.set_types(["int8", "vector"])
            for row_id, vector in zip(ids, vectors, strict=True):
                copy.write_row((row_id, vector))
        cursor.execute(
            f"UPDATE {STAGE_TABLE} AS s SET embedding = v.embedding FROM knowledge_stage_vectors v "
            "WHERE s.id = v.id"
        )


def ingest_finalize(source_id: int, run_key: str, prepared: dict, usage: dict) -> dict:
    """Step 3 (in the engine's ctx.transaction): replace the source's chunks with the staged ones
    and mark it indexed, all in one transaction, so a search sees the old chunks or the new."""
    source = KnowledgeSource.objects.select_for_update().filter(pk=source_id).first()
    if source is None:
        KnowledgeChunkStage.objects.filter(run_key=run_key).delete()
        return {"deleted": True}
    with connection.cursor() as cursor:
        if prepared.get("direct"):
            cursor.execute(f"SELECT count(*), coalesce(sum(token_count), 0) FROM {CHUNK_TABLE} WHERE source_id = %s",
                           [source_id])
            staged, tokens = cursor.fetchone()
            if staged != prepared["chunks"]:
                raise IngestError(f"{prepared['chunks'] - staged} of {prepared['chunks']} chunks were not written")
        else:
            cursor.execute(
                f"SELECT count(*), count(*) FILTER (WHERE embedding IS NULL), coalesce(sum(token_count), 0) "
                f"FROM {STAGE_TABLE} WHERE run_key = %s",
                [run_key],
            )
            staged, missing, tokens = cursor.fetchone()
            if staged != prepared["chunks"] or missing:
                raise IngestError(f"{prepared['chunks'] - staged + missing} of {prepared['chunks']} staged chunks "
                                  "are missing or not embedded")
            cursor.execute(f"DELETE FROM {CHUNK_TABLE} WHERE source_id = %s", [source_id])
            cursor.execute(
                f"INSERT INTO {CHUNK_TABLE} (source_id, workspace_id, ordinal, content, token_count, embedding) "
                f"SELECT source_id, %s, ordinal, content, token_count, embedding FROM {STAGE_TABLE} "
                "WHERE run_key = %s ORDER BY ordinal",
                [source.workspace_id, run_key],
            )
        cursor.execute(f"DELETE FROM {STAGE_TABLE} WHERE run_key = %s", [run_key])
    spent = Usage.from_dict(usage)
    source.ingest_status = KnowledgeSource.Status.INDEXED
    source.ingest_error = ""
    source.content_hash = prepared["content_hash"]
    source.content_type = prepared["content_type"] or source.content_type
    source.byte_size = prepared["byte_size"]
    source.chunk_count = staged
    source.token_count = tokens
    source.embedding_model = knowledge_settings().embedding_model
    source.embedding_tokens += spent.input_tokens
    source.usd_cost += spent.usd_cost
    source.indexed_at = timezone.now()
    if prepared.get("title") and source.title in ("", source.uri):
        source.title = prepared["title"][:300]
    source.save(update_fields=[  # not `text`: a large text source would be rewritten for nothing
        "ingest_status", "ingest_error", "content_hash", "content_type", "byte_size", "chunk_count", "token_count",
        "embedding_model", "embedding_tokens", "usd_cost", "indexed_at", "title", "updated_at"])
    return {"chunks": staged, "tokens": int(tokens), "workspace_id": source.workspace_id}


def ingest_unchanged(source_id: int) -> dict:
    """Identical content: nothing to redo, the source is indexed as it was."""
    updated = KnowledgeSource.objects.filter(pk=source_id).update(
        ingest_status=KnowledgeSource.Status.INDEXED, ingest_error="", updated_at=timezone.now())
    return {"unchanged": bool(updated)}


def ingest_mark_failed(source_id: int, run_key: str, error: str, drop_chunks: bool = False) -> dict:
    """Record why the ingest failed on the source and drop its staged chunks. The chunks of the
    last successful ingest, if any, stay searchable; a failed first ingest (`drop_chunks`) leaves
    none of its batches behind."""
    KnowledgeChunkStage.objects.filter(run_key=run_key).delete()
    if drop_chunks:
        KnowledgeChunk.objects.filter(source_id=source_id).delete()
    KnowledgeSource.objects.filter(pk=source_id).update(
        ingest_status=KnowledgeSource.Status.FAILED, ingest_error=error[:5000], updated_at=timezone.now())
    return {"failed": True}

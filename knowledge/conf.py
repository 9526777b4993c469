"""The knowledge base's tunables, read from Django settings (their defaults: config/settings/llm.py)."""

from dataclasses import dataclass

from django.conf import settings


@dataclass(frozen=True)
class KnowledgeSettings:
    chunk_size: int  # characters a chunk holds at most (paragraphs are packed up to it)
    chunk_overlap: int  # characters of the previous chunk repeated at the start of the next
    max_chunks_per_source: int  # a larger document fails with a message instead of being cut silently
    upload_max_bytes: int
    url_timeout_seconds: int  # the whole fetch of a URL, redirects included
    url_max_bytes: int
    url_allowed_networks: tuple[str, ...]  # private networks a URL may still reach
    exact_scan_max_rows: int  # filters selecting at most this many chunks are searched exactly
    hnsw_ef_search: int  # the HNSW candidate list of an approximate search
    ingest_batch_chunks: int  # chunks one embedding step handles (a failed batch retries alone)
    ingest_queue: str
    ingest_retries: int  # retries of a failed fetch or embedding batch
    ingest_backoff_base: float  # seconds before the first retry, doubled each time
    embedding_model: str
    embedding_dimensions: int


def knowledge_settings() -> KnowledgeSettings:
    return KnowledgeSettings(
        chunk_size=settings.KNOWLEDGE_CHUNK_SIZE,
        chunk_overlap=settings.KNOWLEDGE_CHUNK_OVERLAP,
        max_chunks_per_source=settings.KNOWLEDGE_MAX_CHUNKS_PER_SOURCE,
        upload_max_bytes=settings.KNOWLEDGE_UPLOAD_MAX_BYTES,
        url_timeout_seconds=settings.KNOWLEDGE_URL_TIMEOUT_SECONDS,
        url_max_bytes=settings.KNOWLEDGE_URL_MAX_BYTES,
        url_allowed_networks=tuple(settings.KNOWLEDGE_URL_ALLOWED_NETWORKS),
        exact_scan_max_rows=settings.KNOWLEDGE_EXACT_SCAN_MAX_ROWS,
        hnsw_ef_search=settings.KNOWLEDGE_HNSW_EF_SEARCH,
        ingest_batch_chunks=settings.KNOWLEDGE_INGEST_BATCH_CHUNKS,
        ingest_queue=settings.KNOWLEDGE_INGEST_QUEUE,
        ingest_retries=settings.KNOWLEDGE_INGEST_RETRIES,
        ingest_backoff_base=settings.KNOWLEDGE_INGEST_BACKOFF_BASE,
        embedding_model=settings.EMBEDDING_MODEL,
        embedding_dimensions=settings.EMBEDDING_DIMENSIONS,
    )

"""The knowledge base's tunables (set from the environment in config/settings/llm.py)."""

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
        chunk_size=getattr(settings, "KNOWLEDGE_CHUNK_SIZE", 1400),
        chunk_overlap=getattr(settings, "KNOWLEDGE_CHUNK_OVERLAP", 200),
        max_chunks_per_source=getattr(settings, "KNOWLEDGE_MAX_CHUNKS_PER_SOURCE", 20_000),
        upload_max_bytes=getattr(settings, "KNOWLEDGE_UPLOAD_MAX_BYTES", 20 * 1024 * 1024),
        url_timeout_seconds=getattr(settings, "KNOWLEDGE_URL_TIMEOUT_SECONDS", 15),
        url_max_bytes=getattr(settings, "KNOWLEDGE_URL_MAX_BYTES", 10 * 1024 * 1024),
        url_allowed_networks=tuple(getattr(settings, "KNOWLEDGE_URL_ALLOWED_NETWORKS", ())),
        exact_scan_max_rows=getattr(settings, "KNOWLEDGE_EXACT_SCAN_MAX_ROWS", 5_000),
        hnsw_ef_search=getattr(settings, "KNOWLEDGE_HNSW_EF_SEARCH", 400),
        ingest_batch_chunks=getattr(settings, "KNOWLEDGE_INGEST_BATCH_CHUNKS", 256),
        ingest_queue=getattr(settings, "KNOWLEDGE_INGEST_QUEUE", "ingest"),
        ingest_retries=getattr(settings, "KNOWLEDGE_INGEST_RETRIES", 3),
        ingest_backoff_base=getattr(settings, "KNOWLEDGE_INGEST_BACKOFF_BASE", 2.0),
        embedding_model=settings.EMBEDDING_MODEL,
        embedding_dimensions=settings.EMBEDDING_DIMENSIONS,
    )

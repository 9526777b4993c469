"""Bulk loading: ingest many sources with the chunk table's global indexes built afterwards.

Every chunk written into the indexed table pays for the GIN full-text index (about 60 us a
chunk, measured on this project's benchmark machine) and, far worse, the global HNSW index
(COPY falls from about 31,000 to 900 rows/s, docs/knowledge-bulk-load.md). Building both once after the
load is much cheaper (GIN about 30 us a row; HNSW 100,000 rows in about 13 s). That is right for
an initial import or a re-import in a maintenance window, never for a live knowledge base:
while the indexes are missing, full-text and unfiltered vector searches of *every* workspace
fall back to sequential scans. Hence it is an explicit mode (``manage.py ingest --bulk``),
never automatic.

    with deferred_indexes() as report:
        ...ingest, driving the runs in this process (or in forked children)...
    report["gin_seconds"], report["hnsw_seconds"]

While the block runs, the workflow's ``vector_index`` step leaves per-workspace partial HNSW
indexes alone (they would be maintained row by row too); they are synchronised at the end.
A block that is interrupted (the process killed) leaves the indexes missing: run
``restore_indexes()`` (``manage.py ingest --restore-indexes``), which recreates whatever index of
the model is missing, or any later bulk ingest, which does so at its end.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator

from django.conf import settings
from django.db import connection
from pgvector.django import HnswIndex

from knowledge.models import KnowledgeChunk

logger = logging.getLogger("knowledge.bulk")

CHUNK_TABLE = KnowledgeChunk._meta.db_table
# the global indexes a bulk load defers, in the order they are rebuilt (the quick one first)
DEFERRED = ("knowledge_chunk_search_gin", "knowledge_chunk_embedding_hnsw")

_active = False  # read by knowledge.search.workspace_vector_index_sync (inherited by forked children)


def bulk_active() -> bool:
    return _active


def _existing(names) -> set[str]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT relname FROM pg_class WHERE relkind = 'i' AND relname = ANY(%s)", [list(names)])
        return {row[0] for row in cursor.fetchall()}


def restore_indexes() -> dict[str, float]:
    """Create any index of KnowledgeChunk's Meta that is missing (as its migration made it), with
    more maintenance memory; returns {index name: seconds spent building it}."""
    wanted = {index.name: index for index in KnowledgeChunk._meta.indexes}
    missing = [name for name in DEFERRED if name in wanted and name not in _existing([name])]
    missing += [name for name in wanted if name not in DEFERRED and name not in _existing([name])]
    spent: dict[str, float] = {}
    if not missing:
        return spent
    memory = settings.KNOWLEDGE_BULK_MAINTENANCE_WORK_MEM
    with connection.cursor() as cursor:
        try:
            for name in missing:
                # HNSW builds in memory (at the default 64MB: 76 s instead of about 20 s for 100,000
                # rows, docs/knowledge-bulk-load.md); the GIN build was measured slightly faster at the default
                cursor.execute("SELECT set_config('maintenance_work_mem', %s, false)",
                               [memory if isinstance(wanted[name], HnswIndex) else "64MB"])
                started = time.perf_counter()
                with connection.schema_editor(atomic=False) as editor:
                    editor.add_index(KnowledgeChunk, wanted[name])
                spent[name] = time.perf_counter() - started
                logger.info("built %s in %.1fs", name, spent[name])
            cursor.execute(f"ANALYZE {CHUNK_TABLE}")
        finally:
            cursor.execute("RESET maintenance_work_mem")
    return spent


@contextlib.contextmanager
def deferred_indexes(*, sync_workspaces: bool = True) -> Iterator[dict]:
    """Drop the chunk table's global GIN and HNSW indexes, run the block, build them again.

    Yields a dict filled on exit: ``gin_seconds``, ``hnsw_seconds`` and, with `sync_workspaces`,
    ``workspaces`` (the partial-index actions of the workspaces holding chunks)."""
    global _active
    if connection.in_atomic_block:
        raise RuntimeError("deferred_indexes() cannot run inside a transaction")
    report: dict = {}
    with connection.cursor() as cursor:
        for name in DEFERRED:
            cursor.execute(f"DROP INDEX IF EXISTS {name}")
    _active = True
    try:
        yield report
    finally:
        _active = False
        built = restore_indexes()
        report["gin_seconds"] = built.get("knowledge_chunk_search_gin", 0.0)
        report["hnsw_seconds"] = built.get("knowledge_chunk_embedding_hnsw", 0.0)
    if sync_workspaces:
        from knowledge.search import workspace_vector_index_sync

        with connection.cursor() as cursor:
            cursor.execute(f"SELECT DISTINCT workspace_id FROM {CHUNK_TABLE}")
            workspace_ids = [row[0] for row in cursor.fetchall()]
        report["workspaces"] = {ws: workspace_vector_index_sync(ws)["action"] for ws in workspace_ids}

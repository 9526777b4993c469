"""Search over a workspace's chunks: vector, full-text, and hybrid (reciprocal-rank fusion).

Every search is filtered by workspace, optionally by sources. A filter in front of one global
HNSW index loses recall badly (the index walk finds its ef_search candidates, and few of them
pass the filter: measured here, a workspace holding 1% of the rows gets 0.4 of its 10
neighbours back), so the vector plan is chosen per query:

``exact``      the filter selects at most KNOWLEDGE_EXACT_SCAN_MAX_ROWS chunks (known from the
               sources' chunk counts, one cheap query): scan them through the workspace (or
               source) btree and sort by distance. Recall 1.0, about 2.7 ms per 1,000 rows.
``partial``    a larger workspace with no source filter: its own partial HNSW index
               (``WHERE workspace_id = N``), created by ingestion once the workspace passes the
               threshold. Recall ~0.99 at sub-millisecond latency, like an unfiltered search.
``iterative``  anything else (a large source filter, or a large workspace whose index is not
               built yet): the global index with pgvector's iterative scan, then an exact
               fallback when it returns fewer than k rows. Slower and, for very selective
               filters, less complete; the two plans above exist to keep queries off this one.

The plan's name is returned with the hits, so an operator can see why a query was slow.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
from django.db import connection, transaction

from knowledge.conf import knowledge_settings
from knowledge.models import SEARCH_CONFIG, KnowledgeChunk, KnowledgeSource
from llm.embeddings import get_embedding_provider

logger = logging.getLogger("knowledge.search")

CHUNK_TABLE = KnowledgeChunk._meta.db_table
SOURCE_TABLE = KnowledgeSource._meta.db_table
RRF_K = 60
MODES = ("hybrid", "vector", "fulltext")
MAX_K = 100


class SearchError(ValueError):
    pass


@dataclass(frozen=True)
class SearchHit:
    chunk_id: int
    source_id: int
    source_title: str
    ordinal: int
    content: str
    score: float  # higher is better: RRF score (hybrid), 1 - cosine distance (vector), ts_rank_cd (full text)
    distance: float | None = None  # cosine distance, when the vector search ranked it
    vector_rank: int | None = None  # 1-based
    text_rank: int | None = None  # 1-based


@dataclass(frozen=True)
class SearchResult:
    query: str
    mode: str
    hits: list[SearchHit]
    plan: str = ""  # the vector plan used: exact, partial or iterative ("" for full text only)
    candidates: int = 0  # chunks the filter selects (from the sources' chunk counts)
    notes: list[str] = field(default_factory=list)


def workspace_index_name(workspace_id: int) -> str:
    return f"knowledge_chunk_ws{int(workspace_id)}_hnsw"


def _vector_literal(vector) -> str:
    return "[" + ",".join(repr(float(x)) for x in np.asarray(vector, dtype=np.float32)) + "]"


# --------------------------------------------------------------------------------------------- plan


def vector_plan(*, workspace_id: int, source_ids: Sequence[int] | None = None) -> tuple[str, int]:
    """(plan, candidate rows) for a vector search under this filter: one query on the sources."""
    conf = knowledge_settings()
    sql = f"SELECT coalesce(sum(chunk_count), 0) FROM {SOURCE_TABLE} WHERE workspace_id = %s"
    params: list = [workspace_id]
    if source_ids is not None:
        sql += " AND id = ANY(%s)"
        params.append(list(source_ids))
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT ({sql}), coalesce((SELECT indisvalid FROM pg_index WHERE indexrelid = to_regclass(%s)), false)",
            [*params, workspace_index_name(workspace_id)],
        )
        candidates, has_index = cursor.fetchone()
    candidates = int(candidates)
    if candidates <= conf.exact_scan_max_rows:
        return "exact", candidates
    if source_ids is None and has_index:
        return "partial", candidates
    return "iterative", candidates


# ------------------------------------------------------------------------------------------- vector


def _filter_sql(workspace_id: int, source_ids: Sequence[int] | None) -> tuple[str, list]:
    # the workspace id is inlined (an integer, never user text) so the planner can prove a
    # partial index's predicate whatever the parameter binding
    sql = f"c.workspace_id = {int(workspace_id)}"
    params: list = []
    if source_ids is not None:
        sql += " AND c.source_id = ANY(%s)"
        params.append(list(source_ids))
    return sql, params


def vector_search(*, workspace_id: int, vector, k: int = 8, source_ids: Sequence[int] | None = None,
                  plan: str | None = None, explain: bool = False) -> tuple[list[tuple], str, int]:
    """Rows (id, source_id, ordinal, content, distance) nearest to `vector`, the plan and the candidates.
    With `explain`, the rows are the lines of Postgres' EXPLAIN of the query instead."""
    if source_ids is not None and not source_ids:
        return [], "exact", 0
    chosen, candidates = vector_plan(workspace_id=workspace_id, source_ids=source_ids)
    plan = plan or chosen
    where, params = _filter_sql(workspace_id, source_ids)
    literal = _vector_literal(vector)
    columns = "c.id, c.source_id, c.ordinal, c.content, c.embedding <=> %s::vector AS distance"
    ef = max(knowledge_settings().hnsw_ef_search, k)
    with transaction.atomic(), connection.cursor() as cursor:
        if plan == "exact":
            # OFFSET 0 keeps the subquery apart, so the HNSW index cannot serve the ORDER BY: the
            # filter's btree finds the rows, each distance is computed once, a top-k sort keeps k
            cursor.execute(
                f"{'EXPLAIN ' if explain else ''}SELECT * FROM (SELECT {columns} FROM {CHUNK_TABLE} c "
                f"WHERE {where} OFFSET 0) AS rows ORDER BY distance, id LIMIT %s",
                [literal, *params, k],
            )
            return cursor.fetchall(), plan, candidates
        cursor.execute("SELECT set_config('hnsw.ef_search', %s, true)", [str(ef)])
        if plan == "partial":
            # the workspace's own index is the only path that yields rows in distance order: with
            # sorting ruled out the planner takes it even when its statistics are stale
            cursor.execute("SELECT set_config('enable_sort', 'off', true)")
            cursor.execute(
                f"{'EXPLAIN ' if explain else ''}SELECT {columns} FROM {CHUNK_TABLE} c WHERE {where} "
                "ORDER BY c.embedding <=> %s::vector LIMIT %s",
                [literal, *params, literal, k],
            )
            return cursor.fetchall(), plan, candidates
        cursor.execute("SELECT set_config('hnsw.iterative_scan', 'relaxed_order', true)")
        cursor.execute(
            f"{'EXPLAIN ' if explain else ''}WITH nn AS MATERIALIZED (SELECT {columns} FROM {CHUNK_TABLE} c "
            f"WHERE {where} "
            "ORDER BY c.embedding <=> %s::vector LIMIT %s) SELECT * FROM nn ORDER BY distance, id",
            [literal, *params, literal, k],
        )
        rows = cursor.fetchall()
    if not explain and len(rows) < min(k, candidates):
        # the bounded iterative scan gave up before finding k rows: answer completely instead
        return vector_search(workspace_id=workspace_id, vector=vector, k=k, source_ids=source_ids, plan="exact")[0], \
            "iterative+exact", candidates
    return rows, plan, candidates


# ---------------------------------------------------------------------------------------- full text

_OPERATORS = re.compile(r'"|(^|\s)-\w|\sor\s', re.IGNORECASE)
_WORDS = re.compile(r"\w+")


def _tsquery_sql(query: str) -> tuple[str, list] | None:
    """Quoted phrases, `-word` and `or` keep web-search semantics; plain questions match any of
    their words (ranked by how many and how close), since requiring all of them finds little."""
    if _OPERATORS.search(query):
        return "websearch_to_tsquery(%s::regconfig, %s)", [SEARCH_CONFIG, query]
    words = _WORDS.findall(query.replace("_", " "))
    if not words:
        return None
    return "to_tsquery(%s::regconfig, %s)", [SEARCH_CONFIG, " | ".join(words[:64])]


def fulltext_search(*, workspace_id: int, query: str, k: int = 8,
                    source_ids: Sequence[int] | None = None) -> list[tuple]:
    """Rows (id, source_id, ordinal, content, rank) matching `query`, best first."""
    if source_ids is not None and not source_ids:
        return []
    tsquery = _tsquery_sql(query)
    if tsquery is None:
        return []
    tsquery_sql, tsquery_params = tsquery
    where, params = _filter_sql(workspace_id, source_ids)
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT c.id, c.source_id, c.ordinal, c.content, ts_rank_cd(c.search_vector, q, 1) AS rank "
            f"FROM {CHUNK_TABLE} c, {tsquery_sql} q WHERE {where} AND c.search_vector @@ q "
            "ORDER BY rank DESC, c.id LIMIT %s",
            [*tsquery_params, *params, k],
        )
        return cursor.fetchall()


# ------------------------------------------------------------------------------------------- hybrid


def rrf_fuse(rankings: Sequence[Sequence[int]], *, k: int = RRF_K) -> dict[int, float]:
    """Reciprocal-rank fusion: each list adds 1 / (k + rank) to the score of every id it ranks."""
    scores: dict[int, float] = {}
    for ranking in rankings:
        for rank, item in enumerate(ranking, start=1):
            scores[item] = scores.get(item, 0.0) + 1.0 / (k + rank)
    return scores


def knowledge_search(*, workspace, query: str, mode: str = "hybrid", k: int = 8,
                     source_ids: Sequence[int] | None = None, vector=None) -> SearchResult:
    """Search a workspace's knowledge: the `k` best chunks with scores and their sources' titles.

    `mode` is "hybrid" (reciprocal-rank fusion, k=60, of the vector and full-text rankings, each
    taken 4k deep), "vector" or "fulltext". `source_ids` narrows the search to those sources
    (ids of another workspace simply match nothing). `vector` skips embedding the query.
    """
    workspace_id = getattr(workspace, "pk", workspace)
    query = (query or "").strip()
    if not query and vector is None:
        raise SearchError("the query is empty")
    if mode not in MODES:
        raise SearchError(f"mode must be one of {', '.join(MODES)}, not {mode!r}")
    if not 1 <= k <= MAX_K:
        raise SearchError(f"k must be between 1 and {MAX_K}")
    source_ids = None if source_ids is None else sorted({int(s) for s in source_ids})
    depth = k if mode != "hybrid" else max(4 * k, 40)
    notes: list[str] = []

    vector_rows: list[tuple] = []
    plan, candidates = "", 0
    if mode in ("hybrid", "vector"):
        if vector is None:
            vector = get_embedding_provider().embed_query(query)
        vector_rows, plan, candidates = vector_search(workspace_id=workspace_id, vector=vector, k=depth,
                                                      source_ids=source_ids)
    text_rows: list[tuple] = []
    if mode in ("hybrid", "fulltext") and query:
        text_rows = fulltext_search(workspace_id=workspace_id, query=query, k=depth, source_ids=source_ids)

    rows = {row[0]: row for row in text_rows} | {row[0]: row for row in vector_rows}
    distances = {row[0]: float(row[4]) for row in vector_rows}
    vector_ranks = {row[0]: rank for rank, row in enumerate(vector_rows, start=1)}
    text_ranks = {row[0]: rank for rank, row in enumerate(text_rows, start=1)}
    if mode == "vector":
        scored = [(row[0], 1.0 - float(row[4])) for row in vector_rows]
    elif mode == "fulltext":
        scored = [(row[0], float(row[4])) for row in text_rows]
    else:
        fused = rrf_fuse([[row[0] for row in vector_rows], [row[0] for row in text_rows]])
        scored = sorted(fused.items(), key=lambda item: (-item[1], distances.get(item[0], 2.0), item[0]))
    scored = scored[:k]

    titles = dict(KnowledgeSource.objects.filter(pk__in={rows[i][1] for i, _ in scored}).values_list("id", "title"))
    hits = [
        SearchHit(chunk_id=chunk_id, source_id=rows[chunk_id][1], source_title=titles.get(rows[chunk_id][1], ""),
                  ordinal=rows[chunk_id][2], content=rows[chunk_id][3], score=round(score, 6),
                  distance=distances.get(chunk_id), vector_rank=vector_ranks.get(chunk_id),
                  text_rank=text_ranks.get(chunk_id))
        for chunk_id, score in scored
    ]
    if plan == "iterative+exact":
        notes.append("the approximate scan found too few rows under this filter; answered by an exact scan")
    return SearchResult(query=query, mode=mode, hits=hits, plan=plan, candidates=candidates, notes=notes)


# ------------------------------------------------------------------------------------ vector indexes


def workspace_vector_index_sync(workspace_id: int) -> dict:
    """Give a workspace past KNOWLEDGE_EXACT_SCAN_MAX_ROWS chunks its own partial HNSW index, and
    drop the index of one that shrank below half of it. Run after each ingest (a durable step on
    the ingest queue); concurrent calls for one workspace wait for each other."""
    from knowledge.bulk import bulk_active

    conf = knowledge_settings()
    name = workspace_index_name(workspace_id)
    if bulk_active():  # a bulk load (knowledge.bulk) builds the indexes once, at its end
        return {"rows": None, "index": name, "action": "deferred"}
    in_transaction = connection.in_atomic_block
    # outside a transaction the index is built CONCURRENTLY, so ingests and searches go on meanwhile
    concurrently = "" if in_transaction else " CONCURRENTLY"
    lock_key = 0x6B6E6F77 << 24 | int(workspace_id) & 0xFFFFFF  # 'know' + workspace: one lock per workspace
    with connection.cursor() as cursor:
        if in_transaction:
            cursor.execute("SELECT pg_advisory_xact_lock(%s)", [lock_key])
            cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")  # CREATE INDEX refuses pending deferred checks
        else:
            cursor.execute("SELECT pg_advisory_lock(%s)", [lock_key])
        try:
            action, rows = _sync_index(cursor, workspace_id, name, concurrently, conf.exact_scan_max_rows)
        finally:
            if not in_transaction:
                cursor.execute("SELECT pg_advisory_unlock(%s)", [lock_key])
    if action != "none":
        logger.info("workspace %s has %s chunks: vector index %s %s", workspace_id, rows, name, action)
    return {"rows": rows, "index": name, "action": action}


def _sync_index(cursor, workspace_id: int, name: str, concurrently: str, threshold: int) -> tuple[str, int]:
    # the sources' chunk counts, kept by ingestion: a sum over a few sources, not a count over many chunks
    cursor.execute(f"SELECT COALESCE(sum(chunk_count), 0) FROM {SOURCE_TABLE} WHERE workspace_id = %s",
                   [workspace_id])
    rows = int(cursor.fetchone()[0])
    cursor.execute("SELECT indisvalid FROM pg_index WHERE indexrelid = to_regclass(%s)", [name])
    found = cursor.fetchone()
    exists, valid = found is not None, bool(found and found[0])
    if rows > threshold and not valid:
        if exists:  # an interrupted concurrent build leaves an invalid index behind
            cursor.execute(f"DROP INDEX{concurrently} IF EXISTS {name}")
        cursor.execute("SET maintenance_work_mem = '512MB'")
        try:
            cursor.execute(
                f"CREATE INDEX{concurrently} IF NOT EXISTS {name} ON {CHUNK_TABLE} "
                f"USING hnsw (embedding vector_cosine_ops) WITH (m = 16, ef_construction = 64) "
                f"WHERE workspace_id = {int(workspace_id)}"
            )
        finally:
            cursor.execute("RESET maintenance_work_mem")
        cursor.execute(f"ANALYZE {CHUNK_TABLE}")  # the planner must learn the workspace is large now
        return "created", rows
    if exists and rows < threshold // 2:
        cursor.execute(f"DROP INDEX{concurrently} IF EXISTS {name}")
        return "dropped", rows
    return ("kept" if exists else "none"), rows


def workspace_vector_index_drop(workspace_id: int) -> None:
    """Drop a workspace's partial index (the workspace was deleted)."""
    concurrently = "" if connection.in_atomic_block else " CONCURRENTLY"
    with connection.cursor() as cursor:
        cursor.execute(f"DROP INDEX{concurrently} IF EXISTS {workspace_index_name(workspace_id)}")

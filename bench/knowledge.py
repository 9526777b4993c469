"""knowledge: ingestion rate, HNSW build, and recall@10 / latency of filtered vector search.

The corpus is generated text, not random vectors: a 30,000-word vocabulary drawn with a Zipf
distribution (s = 1.1, like natural language), mixed with topic words (2,000 overlapping topics
of 150 words; by default each document draws 25% of its words from its main topic and 12.5%
from a second one; `--topic-share` sets the first figure), in sentences and paragraphs of
900-1,300 characters. Queries are of two kinds, each measured: held-out paragraphs of a topic in
scope ("passages", the usual ANN-benchmark query) and 12-29-word texts on such a topic
("questions", sparser, hence harder for an approximate index over hashed words).
With the default chunk size (1,400, overlap 200) each paragraph becomes exactly one chunk.
Vectors come from the offline embedder (hashed words and word pairs, 384 dimensions), so
neighbours share words and topics as real text does.

Workspaces: one holds 1% of the chunks, one 10%, and the other 89% are spread over 20
workspaces of about 4,450 chunks (a multi-tenant table). Every source goes through the real
ingestion path: `services.source_create_text`, then the durable workflow (prepare -> embedding
batches -> finalize) driven in-process by `durable.inprocess.run_until_settled`, in 2 processes.

The bulk load runs in the product's bulk mode (`knowledge.bulk.deferred_indexes`, what
`manage.py ingest --bulk` uses): the global GIN and HNSW indexes are dropped, the sources are
ingested, and the indexes are built again at the end (COPY into an HNSW-indexed table runs at
about 900 rows/s, docs/knowledge-bulk-load.md). The bulk ingestion rate counts the load *and* the GIN
rebuild (full-text search is not usable before it); the HNSW build is reported on its own line,
and the rate including it as well. Incremental ingestion into the fully indexed table (GIN and
HNSW in place, no bulk mode) is measured on a sample, to show that cost. Then the 10% workspace
gets its partial HNSW index (the plan ingestion creates for any workspace past
KNOWLEDGE_EXACT_SCAN_MAX_ROWS), and queries are timed through
`knowledge.search.vector_search`, the selector's own plan choice, against exact numpy ground truth:

    unfiltered     the global HNSW index (ef_search = KNOWLEDGE_HNSW_EF_SEARCH)
    1% workspace   the exact plan (1,000 rows through the workspace btree)
    10% workspace  the partial plan (its own HNSW index)

    make bench NAME=knowledge
    python -m bench knowledge [--chunks 100000] [--queries 200] [--processes 2]
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import time

import numpy as np

from bench import common

NAME = "knowledge"
BENCH_DB = "bench_knowledge"
TARGETS = {"ingest_chunks_per_s": 5000, "recall_at_10": 0.97, "p95_ms": 10.0}
PARAGRAPHS_PER_SOURCE = 500


# ------------------------------------------------------------------------------------------ corpus


class Corpus:
    """Generated text with the statistics of a real collection: a Zipf-distributed vocabulary, and
    overlapping topics (each topic's words are drawn from the mid-frequency vocabulary, so related
    topics share words), each document mixing a main and a second topic."""

    def __init__(self, seed: int = 11, vocabulary: int = 30_000, topics: int = 2_000, topic_words: int = 150,
                 topic_share: float = 0.25):
        self.rng = np.random.default_rng(seed)
        self.topic_share = topic_share
        syllables = [c + v for c in "bcdfghjklmnprstvwz" for v in "aeiou"] + ["th", "ch", "sh", "qu", "ng"]
        words: set[str] = set()
        while len(words) < vocabulary:
            n = int(self.rng.integers(1, 4))
            words.add("".join(self.rng.choice(syllables, n)))
        self.words = np.array(sorted(words, key=lambda w: (len(w), w)))  # short words are the frequent ones
        ranks = np.arange(1, vocabulary + 1)
        self.p_global = (1.0 / ranks**1.1) / np.sum(1.0 / ranks**1.1)
        # topic vocabularies come from below the 100 commonest words, favouring the more frequent ones
        pool = np.arange(100, vocabulary)
        p_pool = (1.0 / (pool - 99) ** 0.6) / np.sum(1.0 / (pool - 99) ** 0.6)
        self.topics = [self.rng.choice(pool, topic_words, replace=False, p=p_pool) for _ in range(topics)]
        t_ranks = np.arange(1, topic_words + 1)
        self.p_topic = (1.0 / t_ranks) / np.sum(1.0 / t_ranks)

    def _words(self, topics: list[tuple[int, float]], n: int) -> np.ndarray:
        idx = self.rng.choice(len(self.words), n, p=self.p_global)
        draw = self.rng.random(n)
        low = 0.0
        for topic, share in topics:
            chosen = (draw >= low) & (draw < low + share)
            idx[chosen] = self.topics[topic][self.rng.choice(len(self.topics[topic]), chosen.sum(), p=self.p_topic)]
            low += share
        return self.words[idx]

    def document(self, topic: int, paragraphs: int) -> str:
        """`paragraphs` paragraphs of 900-1,300 characters, sentences of 8-19 words."""
        second = int(self.rng.integers(0, len(self.topics)))
        words = self._words([(topic, self.topic_share), (second, self.topic_share / 2)], paragraphs * 300).tolist()
        sizes = (np.char.str_len(np.array(words)) + 1).tolist()
        targets = self.rng.integers(900, 1200, paragraphs).tolist()  # + one sentence: < 1,400
        breaks = self.rng.integers(8, 20, paragraphs * 50).tolist()
        out, position, b = [], 0, 0
        for target in targets:
            sentences, length = [], 0
            while length < target and position < len(words):
                n = breaks[b % len(breaks)]
                b += 1
                chunk = words[position:position + n]
                position += n
                length += sum(sizes[position - n:position])
                sentences.append(" ".join(chunk).capitalize() + ".")
            out.append(" ".join(sentences))
        return "\n\n".join(out)

    def query(self, topic: int) -> str:
        """A question-sized text (12-29 words) about `topic`."""
        return " ".join(self._words([(topic, min(1.0, 2 * self.topic_share))], int(self.rng.integers(12, 30))))


# -------------------------------------------------------------------------------------------- load


def _drive(source_ids: list[int]) -> int:
    """Run the ingests of these sources to the end, in this process; returns how many failed."""
    from durable.inprocess import run_until_settled
    from knowledge.models import KnowledgeSource

    failed = 0
    for source in KnowledgeSource.objects.filter(pk__in=source_ids).only("ingest_run_id"):
        run = run_until_settled(source.ingest_run_id, max_wait=600)
        failed += run.status != "completed"
    return failed


def _drive_in_worker(source_ids: list[int]) -> int:
    """A forked worker process: its own database connection, closed when done."""
    from django.db import connections

    connections.close_all()
    try:
        return _drive(source_ids)
    finally:
        connections.close_all()


def ingest(plan: list[tuple[object, str, str]], processes: int) -> dict:
    """Create the sources (their texts stored, runs started) and drive every ingest to the end."""
    from django.db import connections

    from knowledge import services

    started = time.perf_counter()
    ids = []
    for workspace, title, text in plan:
        source, _ = services.source_create_text(workspace=workspace, text=text, title=title)
        ids.append(source.pk)
    created = time.perf_counter() - started
    if processes > 1:
        connections.close_all()  # never share a connection across fork
        ctx = multiprocessing.get_context("fork")
        with ctx.Pool(processes) as pool:
            failed = sum(pool.map(_drive_in_worker, [ids[i::processes] for i in range(processes)]))
    else:
        failed = _drive(ids)
    return {"seconds": time.perf_counter() - started, "create_seconds": created, "failed": failed,
            "sources": len(ids)}


# ---------------------------------------------------------------------------------------- measuring


def vectors_of(workspace_id: int | None) -> tuple[np.ndarray, np.ndarray]:
    from knowledge.ingestion import raw_connection

    raw = raw_connection()
    with raw.cursor() as cursor:
        if workspace_id is None:
            cursor.execute("SELECT id, embedding FROM knowledge_knowledgechunk")
        else:
            cursor.execute("SELECT id, embedding FROM knowledge_knowledgechunk WHERE workspace_id = %s",
                           [workspace_id])
        rows = cursor.fetchall()
    ids = np.array([r[0] for r in rows], dtype=np.int64)
    matrix = np.stack([np.asarray(r[1].to_numpy() if hasattr(r[1], "to_numpy") else r[1], dtype=np.float32)
                       for r in rows])
    return ids, matrix


class Truth:
    """Exact cosine neighbours over a set of vectors (numpy), and recall@k as ann-benchmarks counts
    it: a returned row is a hit when it is at least as near as the k-th true neighbour (so rows
    tied at the k-th distance all count; hashed text has ties)."""

    def __init__(self, ids: np.ndarray, matrix: np.ndarray):
        self.ids, self.matrix = ids, matrix
        self.position = {int(i): n for n, i in enumerate(ids)}

    def threshold(self, query: np.ndarray, k: int = 10) -> float:
        k = min(k, len(self.ids))
        sims = self.matrix @ query  # rows and queries are unit length: dot product = cosine similarity
        return float(-np.partition(-sims, k - 1)[k - 1])

    def recall(self, query: np.ndarray, returned: list[int], threshold: float, k: int = 10) -> float:
        k = min(k, len(self.ids))
        hits = sum(1 for i in returned[:k] if float(self.matrix[self.position[i]] @ query) >= threshold - 1e-6)
        return hits / k


def measure(label: str, queries: list[np.ndarray], truth: Truth, search) -> dict:
    for q in queries[:10]:  # warm the caches
        search(q)
    thresholds = [truth.threshold(q) for q in queries]
    latencies, recalls, plans = [], [], set()
    for q, threshold in zip(queries, thresholds, strict=True):
        started = time.perf_counter()
        rows, plan = search(q)
        latencies.append(time.perf_counter() - started)
        plans.add(plan)
        recalls.append(truth.recall(q, [r[0] for r in rows], threshold))
    summary = common.summary_ms(latencies)
    return {"scenario": label, "plan": ",".join(sorted(plans)), "queries": len(queries),
            "recall_at_10": round(float(np.mean(recalls)), 4), "min_recall": round(float(np.min(recalls)), 4),
            **summary}


def unfiltered_search(ef: int):
    from django.db import connection, transaction

    from knowledge.search import _vector_literal

    def run(q):
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("SELECT set_config('hnsw.ef_search', %s, true)", [str(ef)])
            cursor.execute("SELECT id FROM knowledge_knowledgechunk ORDER BY embedding <=> %s::vector LIMIT 10",
                           [_vector_literal(q)])
            return cursor.fetchall(), "global-hnsw"

    return run


def filtered_search(workspace_id: int):
    from knowledge.search import vector_search

    def run(q):
        rows, plan, _candidates = vector_search(workspace_id=workspace_id, vector=q, k=10)
        return rows, plan

    return run


# -------------------------------------------------------------------------------------------- main


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench knowledge", description=__doc__.split("\n")[0])
    parser.add_argument("--chunks", type=int, default=100_000)
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--processes", type=int, default=min(2, os.cpu_count() or 1))
    parser.add_argument("--topic-share", type=float, default=0.25,
                        help="share of a document's words from its main topic (default 0.25)")
    parser.add_argument("--keep", action="store_true", help="keep the bench_knowledge database afterwards")
    args = parser.parse_args()
    per_source = PARAGRAPHS_PER_SOURCE if args.chunks >= 20_000 else max(10, args.chunks // 200)
    sources_total = max(10, args.chunks // per_source)

    common.create_database(BENCH_DB)
    os.environ.setdefault("KNOWLEDGE_EXACT_SCAN_MAX_ROWS", "5000")
    # the corpus is generated text measured with the feature hasher at 384 dimensions, as its results were
    os.environ.setdefault("EMBEDDING_PROVIDER", "offline")
    os.environ.setdefault("EMBEDDING_MODEL", "offline-hash-v2")
    os.environ.setdefault("EMBEDDING_DIMENSIONS", "384")
    common.setup_django(BENCH_DB)
    from django.conf import settings
    from django.db import connection

    from knowledge import search
    from workspaces.models import Workspace

    settings.DURABLE_DISPATCH_ENABLED = False  # this process drives the runs; no Celery worker needed
    threshold = settings.KNOWLEDGE_EXACT_SCAN_MAX_ROWS
    ef = settings.KNOWLEDGE_HNSW_EF_SEARCH
    from knowledge.models import KnowledgeChunk

    hnsw = next(i for i in KnowledgeChunk._meta.indexes if i.name == "knowledge_chunk_embedding_hnsw")
    hnsw_m, hnsw_efc = hnsw.m, hnsw.ef_construction
    results: dict = {"benchmark": NAME, "targets": TARGETS}
    try:
        with common.connect(common.database_url(BENCH_DB)) as conn:
            results["machine"] = common.machine_info(conn)

        # -- corpus and workspaces
        started = time.perf_counter()
        corpus = Corpus(topic_share=args.topic_share)
        small_sources = max(1, round(sources_total * 0.01))
        medium_sources = max(1, round(sources_total * 0.10))
        rest = sources_total - small_sources - medium_sources
        tenants = 20
        workspaces = {"1%": Workspace.objects.create(name="One percent", slug="one-percent"),
                      "10%": Workspace.objects.create(name="Ten percent", slug="ten-percent")}
        others = [Workspace.objects.create(name=f"Tenant {i}", slug=f"tenant-{i}") for i in range(tenants)]
        plan, topics_of = [], {"1%": [], "10%": []}
        topic = 0
        for key, count in (("1%", small_sources), ("10%", medium_sources)):
            for i in range(count):
                topics_of[key].append(topic)
                plan.append((workspaces[key], f"{key} doc {i}", corpus.document(topic, per_source)))
                topic += 1
        for i in range(rest):
            plan.append((others[i % tenants], f"tenant doc {i}", corpus.document(topic % len(corpus.topics),
                                                                                  per_source)))
            topic += 1
        generated = time.perf_counter() - started
        common.say(f"generated {len(plan)} documents x {per_source} paragraphs in {generated:.1f}s")

        # -- bulk ingestion in the product's bulk mode: global GIN and HNSW indexes built after the load
        from knowledge.bulk import deferred_indexes

        with deferred_indexes(sync_workspaces=False) as rebuilt:  # partial indexes are timed below
            load = ingest(plan, args.processes)
        with connection.cursor() as cursor:
            cursor.execute("SELECT count(*) FROM knowledge_knowledgechunk")
            chunks = cursor.fetchone()[0]
        gin, build = rebuilt["gin_seconds"], rebuilt["hnsw_seconds"]
        rate = chunks / (load["seconds"] + gin)
        rate_all = chunks / (load["seconds"] + gin + build)
        common.say(f"ingested {chunks:,} chunks from {load['sources']} sources in {load['seconds']:.1f}s "
                   f"+ GIN rebuild {gin:.1f}s ({rate:,.0f} chunks/s, {load['failed']} failed); "
                   f"HNSW build {build:.1f}s")

        # -- the partial index of the 10% workspace
        started = time.perf_counter()
        synced = {key: search.workspace_vector_index_sync(ws.pk) for key, ws in workspaces.items()}
        partial = time.perf_counter() - started
        synced_others = [search.workspace_vector_index_sync(ws.pk)["action"] for ws in others[:3]]
        common.say(f"HNSW build {build:.1f}s; partial index {partial:.1f}s ({synced['10%']['action']} for "
                   f"{synced['10%']['rows']:,} rows; 1%: {synced['1%']['action']}; tenants: {synced_others})")

        # -- incremental ingestion into the indexed table (a sample, for the record)
        sample_plan = [(others[0], f"incremental {i}", corpus.document(i, 100)) for i in range(4)]
        sample = ingest(sample_plan, 1)
        incremental_rate = (len(sample_plan) * 100) / sample["seconds"]
        common.say(f"incremental ingest with HNSW in place: {incremental_rate:,.0f} chunks/s")

        # -- queries
        all_ids, all_matrix = vectors_of(None)
        from llm.embeddings import get_embedding_provider

        provider = get_embedding_provider()
        scenarios = []

        def texts(kind: str, topics: list[int]) -> list[np.ndarray]:
            # "passage": a held-out paragraph of the topic (the usual ANN-benchmark query, a point of
            # the data's own distribution); "question": 12-29 words on the topic, as a user would type
            made = [corpus.document(t, 1) if kind == "passage" else corpus.query(t) for t in topics]
            return list(provider.embed(made).vectors)

        q_topics = [int(t) for t in corpus.rng.integers(0, topic, args.queries)]
        everything = Truth(all_ids, all_matrix)
        for kind in ("passage", "question"):
            scenarios.append(measure(f"unfiltered, {kind}s", texts(kind, q_topics), everything,
                                     unfiltered_search(ef)))
        for key in ("1%", "10%"):
            ws = workspaces[key]
            ids, matrix = vectors_of(ws.pk)
            chosen = [topics_of[key][int(i)] for i in corpus.rng.integers(0, len(topics_of[key]), args.queries)]
            for kind in ("passage", "question"):
                scenarios.append(measure(f"{key} workspace ({len(ids):,} rows), {kind}s", texts(kind, chosen),
                                         Truth(ids, matrix), filtered_search(ws.pk)))

        # -- report
        met_ingest = rate >= TARGETS["ingest_chunks_per_s"]
        common.print_table(
            f"Ingestion: {chunks:,} chunks x {settings.EMBEDDING_DIMENSIONS} dims, offline embedder, "
            f"{args.processes} process(es)",
            ["what", "value", "target", "verdict"],
            [["bulk ingest (ingest --bulk: load + GIN rebuild)", f"{rate:,.0f} chunks/s",
              f">= {TARGETS['ingest_chunks_per_s']:,}", common.verdict(met_ingest)],
             ["  of which the load / the GIN rebuild", f"{load['seconds']:.1f} s / {gin:.1f} s", "-", "-"],
             ["bulk ingest including the HNSW build", f"{rate_all:,.0f} chunks/s", "-", "-"],
             ["incremental ingest (GIN + HNSW in place)", f"{incremental_rate:,.0f} chunks/s", "-", "-"],
             [f"global HNSW build (m={hnsw_m}, ef_construction={hnsw_efc})", f"{build:.1f} s", "-", "-"],
             ["partial HNSW build (10% workspace)", f"{partial:.1f} s", "-", "-"],
             ["corpus generation (not counted)", f"{generated:.1f} s", "-", "-"]],
        )
        rows = []
        for s in scenarios:
            met = s["recall_at_10"] >= TARGETS["recall_at_10"] and s["p95_ms"] < TARGETS["p95_ms"]
            s["verdict"] = common.verdict(met)
            rows.append([s["scenario"], s["plan"], s["recall_at_10"], s["min_recall"], s["median_ms"], s["p95_ms"],
                         s["verdict"]])
        common.print_table(f"Vector search, k=10, {args.queries} queries each, ef_search={ef}",
                           ["scenario", "plan", "recall@10", "min recall", "p50 ms", "p95 ms", "verdict"], rows)
        results.update({
            "corpus": {"chunks": chunks, "sources": load["sources"] + len(sample_plan), "dimensions":
                       settings.EMBEDDING_DIMENSIONS, "vectors": "offline feature hashing of generated text: "
                       "30,000-word Zipf (s=1.1) vocabulary mixed with 2,000 topic vocabularies",
                       "paragraphs_per_source": per_source, "generation_seconds": round(generated, 2),
                       "topic_share": args.topic_share},
            "ingest": {"chunks_per_s": round(rate, 1), "mode": "bulk (knowledge.bulk.deferred_indexes)",
                       "seconds": round(load["seconds"] + gin, 2), "load_seconds": round(load["seconds"], 2),
                       "gin_rebuild_seconds": round(gin, 2), "chunks_per_s_including_hnsw_build": round(rate_all, 1),
                       "source_create_seconds": round(load["create_seconds"], 2), "processes": args.processes,
                       "failed_sources": load["failed"], "hnsw_during_load": False, "gin_during_load": False,
                       "embedding_model": settings.EMBEDDING_MODEL,
                       "verdict": common.verdict(met_ingest),
                       "incremental_chunks_per_s_with_hnsw": round(incremental_rate, 1)},
            "index": {"hnsw_build_seconds": round(build, 2), "partial_index_seconds": round(partial, 2),
                      "hnsw_m": hnsw_m, "hnsw_ef_construction": hnsw_efc,
                      "maintenance_work_mem": settings.KNOWLEDGE_BULK_MAINTENANCE_WORK_MEM,
                      "exact_scan_max_rows": threshold, "ef_search": ef},
            "search": scenarios,
        })
        common.write_results(NAME, results)
        return 0
    finally:
        common.close_django()
        if not args.keep:
            common.drop_database(BENCH_DB)

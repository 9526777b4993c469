"""Search: hybrid ranking, workspace isolation, source filters, and complete results whatever
share of all chunks the filter selects (the exact, partial-index and iterative plans)."""

import random

import pytest
from django.db import connection

from knowledge import search
from knowledge.models import KnowledgeChunk, KnowledgeSource
from knowledge.search import SearchError, knowledge_search, rrf_fuse, workspace_vector_index_sync
from llm.embeddings import get_embedding_provider
from tests.factories import KnowledgeChunkFactory, KnowledgeSourceFactory, WorkspaceFactory

pytestmark = pytest.mark.django_db

CORPUS = {
    "Engine": [
        "The durable engine checkpoints every step in Postgres before the workflow continues.",
        "After a worker crash the run is replayed from the top and answered from checkpoints.",
        "Leases stop two workers from turning the same run at the same time.",
    ],
    "Kitchen": [
        "Whisk the eggs with sugar until pale, then fold in the flour gently.",
        "Bake the lemon cake for forty minutes and let it cool on a rack.",
    ],
    "Support": [
        "Error code E1042 means the embedding server refused the API key.",
        "Rotate the API key in the settings page, then retry the ingest.",
    ],
}


@pytest.fixture
def corpus(workspace):
    sources = {}
    for title, chunks in CORPUS.items():
        source = KnowledgeSourceFactory(workspace=workspace, title=title, chunk_count=len(chunks))
        for ordinal, content in enumerate(chunks):
            KnowledgeChunkFactory(source=source, ordinal=ordinal, content=content)
        sources[title] = source
    return sources


def test_hybrid_puts_the_chunk_matching_both_ways_first(workspace, corpus):
    result = knowledge_search(workspace=workspace, query="what happens after a worker crash", k=3)
    assert result.mode == "hybrid" and result.plan == "exact"
    top = result.hits[0]
    assert top.content.startswith("After a worker crash")
    assert top.source_title == "Engine"
    assert top.vector_rank == 1 and top.text_rank == 1
    assert top.score == pytest.approx(2 / 61, abs=1e-6)
    assert [h.score for h in result.hits] == sorted((h.score for h in result.hits), reverse=True)


def test_full_text_finds_an_exact_code_that_vectors_rank_low(workspace, corpus):
    fulltext = knowledge_search(workspace=workspace, query="E1042", mode="fulltext", k=3)
    assert [h.content[:20] for h in fulltext.hits] == ["Error code E1042 mea"]
    hybrid = knowledge_search(workspace=workspace, query="E1042", k=3)
    assert hybrid.hits[0].content.startswith("Error code E1042")


def test_vector_mode_scores_are_cosine_similarities(workspace, corpus):
    result = knowledge_search(workspace=workspace, query="lemon cake baking", mode="vector", k=2)
    assert result.hits[0].source_title == "Kitchen"
    assert all(h.score == pytest.approx(1 - h.distance, abs=1e-6) for h in result.hits)


def test_web_search_syntax_is_honoured(workspace, corpus):
    result = knowledge_search(workspace=workspace, query='"API key" -rotate', mode="fulltext", k=5)
    assert [h.content[:10] for h in result.hits] == ["Error code"]


def test_search_never_leaves_the_workspace(workspace, other_workspace, corpus):
    foreign = KnowledgeSourceFactory(workspace=other_workspace, title="Foreign", chunk_count=1)
    KnowledgeChunkFactory(source=foreign, ordinal=0, content="After a worker crash the run is replayed (foreign).")
    for mode in ("hybrid", "vector", "fulltext"):
        hits = knowledge_search(workspace=workspace, query="worker crash replayed", mode=mode, k=20).hits
        assert hits and all(h.source_id != foreign.pk for h in hits)
    # naming another workspace's source matches nothing rather than leaking it
    assert knowledge_search(workspace=workspace, query="crash", source_ids=[foreign.pk]).hits == []


def test_source_filter(workspace, corpus):
    result = knowledge_search(workspace=workspace, query="crash and cake", k=10, source_ids=[corpus["Kitchen"].pk])
    assert {h.source_title for h in result.hits} == {"Kitchen"}
    assert result.candidates == 2


def test_bad_input_is_a_search_error(workspace):
    with pytest.raises(SearchError, match="empty"):
        knowledge_search(workspace=workspace, query="   ")
    with pytest.raises(SearchError, match="mode"):
        knowledge_search(workspace=workspace, query="x", mode="fuzzy")
    with pytest.raises(SearchError, match="k must be"):
        knowledge_search(workspace=workspace, query="x", k=0)
    # punctuation-only queries and empty workspaces answer with nothing, not an error
    assert knowledge_search(workspace=workspace, query="!!! ???", k=3).hits == []


def test_rrf_fuse():
    scores = rrf_fuse([[1, 2, 3], [3, 1]])
    assert scores[1] == pytest.approx(1 / 61 + 1 / 62)
    assert scores[3] == pytest.approx(1 / 63 + 1 / 61)
    assert scores[2] == pytest.approx(1 / 62)


# ------------------------------------------------------------------- completeness under filters

WORDS = [f"term{i}" for i in range(400)]


def _text(rng):
    # Zipf-like: a few words are everywhere, most are rare
    return " ".join(WORDS[min(int(rng.paretovariate(1.1)) - 1, len(WORDS) - 1)] for _ in range(30))


def _load(workspace, sources: int, per_source: int, rng) -> list[KnowledgeSource]:
    provider = get_embedding_provider()
    made = []
    for s in range(sources):
        source = KnowledgeSourceFactory(workspace=workspace, title=f"{workspace.slug}-{s}", chunk_count=per_source)
        texts = [_text(rng) for _ in range(per_source)]
        vectors = provider.embed(texts).vectors
        KnowledgeChunk.objects.bulk_create(
            KnowledgeChunk(source=source, workspace=workspace, ordinal=i, content=t, token_count=30, embedding=v)
            for i, (t, v) in enumerate(zip(texts, vectors, strict=True))
        )
        made.append(source)
    return made


@pytest.fixture
def crowded(db):
    """A small workspace (2% of the rows) and a big one beside it."""
    rng = random.Random(7)
    small, big = WorkspaceFactory(slug="small"), WorkspaceFactory(slug="big")
    small_sources = _load(small, 2, 20, rng)
    big_sources = _load(big, 10, 200, rng)
    queries = [_text(rng) for _ in range(15)]
    return small, small_sources, big, big_sources, queries


def _recall(hits, truth):
    return len({h.chunk_id for h in hits} & set(truth)) / len(truth)


def test_small_workspace_beside_a_big_one_gets_complete_results(crowded, brute_force):
    small, _sources, _big, _big_sources, queries = crowded
    for query in queries:
        vector = get_embedding_provider().embed_query(query)
        result = knowledge_search(workspace=small, query=query, mode="vector", k=10, vector=vector)
        assert result.plan == "exact"
        assert [h.chunk_id for h in result.hits] == brute_force(small.pk, vector, 10)


def test_global_index_with_a_plain_filter_would_lose_results(crowded, brute_force):
    """Why the plan matters: forcing the global HNSW index under the small workspace's filter returns
    far fewer than k rows (the problem the exact plan avoids)."""
    small, _sources, _big, _big_sources, queries = crowded
    vector = get_embedding_provider().embed_query(queries[0])
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL hnsw.ef_search = 10")
        cursor.execute("SET LOCAL enable_seqscan = off")
        cursor.execute("SET LOCAL enable_bitmapscan = off")
        cursor.execute("SET LOCAL enable_indexscan = on")
        cursor.execute(
            "SELECT id FROM knowledge_knowledgechunk WHERE workspace_id = %s "
            "ORDER BY embedding <=> %s::vector LIMIT 10",
            [small.pk, search._vector_literal(vector)],
        )
        naive = cursor.fetchall()
        cursor.execute("RESET ALL")
    assert len(naive) < 10


def test_big_workspace_gets_a_partial_index_and_complete_results(crowded, brute_force, settings):
    settings.KNOWLEDGE_EXACT_SCAN_MAX_ROWS = 500
    _small, _sources, big, _big_sources, queries = crowded
    assert workspace_vector_index_sync(big.pk)["action"] == "created"
    assert workspace_vector_index_sync(big.pk)["action"] == "kept"
    recalls = []
    for query in queries:
        vector = get_embedding_provider().embed_query(query)
        result = knowledge_search(workspace=big, query=query, mode="vector", k=10, vector=vector)
        assert result.plan == "partial" and len(result.hits) == 10
        recalls.append(_recall(result.hits, brute_force(big.pk, vector, 10)))
    assert sum(recalls) / len(recalls) >= 0.95
    lines, _plan, _candidates = search.vector_search(workspace_id=big.pk, vector=vector, k=10, explain=True)
    plan = "\n".join(row[0] for row in lines)
    assert search.workspace_index_name(big.pk) in plan


def test_large_source_filter_uses_the_iterative_scan_and_stays_complete(crowded, brute_force, settings):
    settings.KNOWLEDGE_EXACT_SCAN_MAX_ROWS = 500
    _small, _sources, big, big_sources, queries = crowded
    chosen = [s.pk for s in big_sources[:4]]  # 800 rows of the big workspace's 2,000
    for query in queries[:5]:
        vector = get_embedding_provider().embed_query(query)
        result = knowledge_search(workspace=big, query=query, mode="vector", k=10, vector=vector, source_ids=chosen)
        assert result.plan.startswith("iterative")
        assert len(result.hits) == 10 and {h.source_id for h in result.hits} <= set(chosen)
        assert _recall(result.hits, brute_force(big.pk, vector, 10, chosen)) >= 0.8


def test_a_shrunken_workspace_loses_its_index(crowded, settings):
    settings.KNOWLEDGE_EXACT_SCAN_MAX_ROWS = 500
    _small, _sources, big, big_sources, _queries = crowded
    workspace_vector_index_sync(big.pk)
    KnowledgeSource.objects.filter(workspace=big).exclude(pk=big_sources[0].pk).delete()  # as source_delete does
    assert workspace_vector_index_sync(big.pk)["action"] == "dropped"
    assert search.vector_plan(workspace_id=big.pk, source_ids=[big_sources[0].pk]) == ("exact", 200)


def test_deleting_a_workspace_drops_its_vector_index(crowded, settings, django_capture_on_commit_callbacks):
    settings.KNOWLEDGE_EXACT_SCAN_MAX_ROWS = 500
    _small, _sources, big, _big_sources, _queries = crowded
    workspace_vector_index_sync(big.pk)
    name = search.workspace_index_name(big.pk)
    with django_capture_on_commit_callbacks(execute=True):
        big.delete()
    with connection.cursor() as cursor:
        cursor.execute("SELECT to_regclass(%s)", [name])
        assert cursor.fetchone()[0] is None

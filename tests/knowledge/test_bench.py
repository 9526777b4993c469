"""Smoke test of bench/knowledge.py: its corpus, ground truth and ingestion driver at a tiny size."""

import numpy as np
import pytest

from bench import knowledge as bench
from knowledge.models import KnowledgeChunk
from llm.embeddings import get_embedding_provider


def test_corpus_paragraphs_make_one_chunk_each():
    from knowledge.chunking import chunk_text

    corpus = bench.Corpus(vocabulary=2_000, topics=20)
    document = corpus.document(3, 12)
    assert len(chunk_text(document)) == 12
    words = document.lower().replace(".", "").split()
    counts = np.sort(np.unique(words, return_counts=True)[1])[::-1]
    assert counts[0] > 5 * counts[len(counts) // 2]  # Zipf-like: a few words are everywhere


def test_truth_counts_ties_as_hits():
    ids = np.array([10, 11, 12])
    matrix = np.array([[1, 0], [1, 0], [0, 1]], dtype=np.float32)
    truth = bench.Truth(ids, matrix)
    query = np.array([1, 0], dtype=np.float32)
    threshold = truth.threshold(query, k=1)
    assert truth.recall(query, [11], threshold, k=1) == 1.0  # tied with 10
    assert truth.recall(query, [12], threshold, k=1) == 0.0


@pytest.mark.django_db
def test_ingest_driver_and_searches(workspace, settings):
    settings.DURABLE_DISPATCH_ENABLED = False
    corpus = bench.Corpus(vocabulary=2_000, topics=20)
    result = bench.ingest([(workspace, "doc", corpus.document(1, 6))], processes=1)
    assert result["failed"] == 0 and KnowledgeChunk.objects.count() == 6
    ids, matrix = bench.vectors_of(workspace.pk)
    query = get_embedding_provider().embed_query(corpus.query(1))
    row = bench.measure("tiny", [query] * 3, bench.Truth(ids, matrix), bench.filtered_search(workspace.pk))
    assert row["plan"] == "exact" and row["recall_at_10"] == 1.0

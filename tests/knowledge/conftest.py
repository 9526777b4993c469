import pytest


@pytest.fixture(autouse=True)
def _fast_ingest_retries(settings):
    settings.KNOWLEDGE_INGEST_BACKOFF_BASE = 0.01  # retries in tests wait milliseconds, not seconds


@pytest.fixture
def ingest():
    """Run a source's ingest to the end in-process and return the refreshed source and run."""
    from durable.inprocess import run_until_settled

    def drive(source):
        source.refresh_from_db()
        run = run_until_settled(source.ingest_run_id, max_wait=30)
        source.refresh_from_db()
        return source, run

    return drive


@pytest.fixture
def brute_force():
    """The exact k nearest chunk ids of a workspace, computed in numpy (the ground truth)."""
    import numpy as np

    from knowledge.models import KnowledgeChunk

    def nearest(workspace_id, vector, k, source_ids=None):
        chunks = KnowledgeChunk.objects.filter(workspace_id=workspace_id)
        if source_ids is not None:
            chunks = chunks.filter(source_id__in=source_ids)
        rows = list(chunks.values_list("id", "embedding"))
        ids = np.array([r[0] for r in rows])
        matrix = np.array([np.asarray(r[1], dtype=np.float32) for r in rows])
        query = np.asarray(vector, dtype=np.float32)
        sims = matrix @ query / (np.linalg.norm(matrix, axis=1) * np.linalg.norm(query))
        order = np.lexsort((ids, -sims))[:k]
        return [int(i) for i in ids[order]]

    return nearest


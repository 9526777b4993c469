"""Ingestion as a durable workflow: a crash at any point loses nothing and redoes little.

    prepare (inline)        fetch / read, extract, chunk, stage the chunks
    embed:0 .. embed:N-1    one step per batch on the ingest queue, each retried alone
    finalize (transaction)  swap the staged chunks in and mark the source indexed, atomically
    vector_index            give a workspace that grew large its own HNSW index

Any failure is recorded on the source (ingest_status failed, ingest_error) and fails the run.
"""

from __future__ import annotations

from durable import Context, FanFailed, Step, StepFailed, workflow
from knowledge.conf import knowledge_settings
from knowledge.ingestion import (
    IngestError,
    ingest_embed_batch,
    ingest_finalize,
    ingest_mark_failed,
    ingest_prepare,
    ingest_unchanged,
)
from knowledge.search import workspace_vector_index_sync
from llm.usage import Usage

INGEST_WORKFLOW = "knowledge.ingest_source"


@workflow(INGEST_WORKFLOW)  # started by knowledge.services only, never through the runs API
def ingest_source(ctx: Context, input: dict) -> dict:
    """Ingest (or, with mode "reembed", re-embed) one knowledge source of the run's workspace.
    Input: {"source_id": int, "mode": "ingest" | "reembed", "force": bool}. A source of another
    workspace fails the run and is left untouched."""
    source_id = int(input["source_id"])
    mode = input.get("mode", "ingest")
    conf = knowledge_settings()
    run_key = ctx.run_id
    prepared: dict = {}
    try:
        prepared = ctx.step("prepare", ingest_prepare, source_id, run_key, mode, bool(input.get("force")),
                            ctx.namespace, retries=conf.ingest_retries, backoff_base=conf.ingest_backoff_base)
        if prepared.get("refused"):
            raise IngestError(prepared["refused"])
        if prepared.get("deleted"):
            return {"status": "deleted"}
        if prepared.get("error"):
            raise IngestError(prepared["error"])
        if prepared.get("unchanged"):
            ctx.step("unchanged", ingest_unchanged, source_id)
            return {"status": "unchanged"}
        batches = ctx.all([
            Step(f"embed:{i}", ingest_embed_batch,
                 (source_id, run_key, i, prepared["batch_size"], prepared["direct"], prepared["workspace_id"]),
                 queue=conf.ingest_queue, retries=conf.ingest_retries, backoff_base=conf.ingest_backoff_base,
                 timeout=600)
            for i in range(prepared["batches"])
        ])
        refused = [b for b in batches if b.get("error")]
        if refused:
            raise IngestError(f"embedding batch {refused[0]['batch']} was refused: {refused[0]['error']}")
        usage = Usage()
        for batch in batches:
            usage = usage + Usage.from_dict(batch["usage"])
        done = ctx.transaction("finalize", ingest_finalize, source_id, run_key, prepared, usage.as_dict())
        if done.get("deleted"):
            return {"status": "deleted"}
    except Exception as exc:
        if prepared.get("refused"):
            raise  # another workspace's source: record nothing on it
        ctx.step("mark_failed", ingest_mark_failed, source_id, run_key, _describe(exc), bool(prepared.get("direct")))
        raise
    try:
        # the source is indexed either way; a failed index build only leaves large searches slower
        index = ctx.step("vector_index", workspace_vector_index_sync, done["workspace_id"], queue=conf.ingest_queue,
                         retries=1, timeout=3600)
    except StepFailed as exc:
        index = {"error": _describe(exc)}
    return {"status": "indexed", "chunks": done["chunks"], "tokens": done["tokens"], "usage": usage.as_dict(),
            "vector_index": index}


def _describe(exc: Exception) -> str:
    if isinstance(exc, FanFailed):
        index, failure = next(iter(exc.failures.items()))
        return (f"embedding batch {index} failed after its retries "
                f"({len(exc.failures)} of {len(exc.results)} batches failed): {_describe(failure)}")
    if isinstance(exc, StepFailed):
        error = exc.error or {}
        message = error.get("message") or str(exc)
        return f"{exc.name}: {message}" if exc.name != "prepare" else message
    return str(exc) or type(exc).__name__

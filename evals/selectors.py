"""Reads of the evals app."""

from __future__ import annotations

from evals.models import EvalRun, GoldenResult, GoldenSet
from workflows.models import WorkflowVersion


def latest_completed_run(*, golden_set: GoldenSet, version: WorkflowVersion) -> EvalRun | None:
    return EvalRun.objects.filter(golden_set=golden_set, workflow_version=version,
                                  status=EvalRun.Status.COMPLETED).order_by("-ended_at", "-pk").first()


def run_scores(run: EvalRun) -> dict[int, float | None]:
    """Per-item scores of an eval run ({item id: score}; None for a grading error)."""
    return dict(GoldenResult.objects.filter(eval_run=run).values_list("golden_item_id", "score"))


def score_histogram(run: EvalRun, *, bins: int = 10) -> list[dict]:
    """Counts of the run's scores in `bins` equal bins over 0..1 (the last bin includes 1.0)."""
    counts = [0] * bins
    for score in GoldenResult.objects.filter(eval_run=run, score__isnull=False).values_list("score", flat=True):
        counts[min(bins - 1, int(score * bins))] += 1
    return [{"low": round(i / bins, 4), "high": round((i + 1) / bins, 4), "count": c} for i, c in enumerate(counts)]


def golden_set_lookup(ref: str, *, workspace: str | None = None) -> GoldenSet:
    """A golden set by id or by name (with the workspace's slug when the name is in several), for the
    operator's CLI; LookupError with the reason when none or several match."""
    sets = GoldenSet.objects.select_related("workspace", "workflow")
    if workspace:
        sets = sets.filter(workspace__slug=workspace)
    if ref.isascii() and ref.isdigit():
        found = sets.filter(pk=int(ref)).first()
        if found is not None:
            return found
    matches = list(sets.filter(name=ref)[:2])
    if not matches:
        raise LookupError(f"no golden set {ref!r}" + (f" in workspace {workspace!r}" if workspace else ""))
    if len(matches) > 1:
        raise LookupError(f"several golden sets are named {ref!r}: add --workspace SLUG")
    return matches[0]

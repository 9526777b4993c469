"""Reads of the evals app."""

from __future__ import annotations

from collections import Counter, defaultdict

from django.db.models import Q

from evals import splits
from evals.models import EvalRun, GoldenItem, GoldenResult, GoldenSet
from workflows.models import WorkflowVersion


def latest_completed_run(*, golden_set: GoldenSet, version: WorkflowVersion,
                         covering: list[int] | None = None) -> EvalRun | None:
    """The version's latest completed eval run over the whole set (a minibatch run is not one); with `covering`,
    over at least those items (a run of some items of the set, such as an evolution's test split, counts)."""
    runs = EvalRun.objects.filter(golden_set=golden_set, workflow_version=version, status=EvalRun.Status.COMPLETED)
    if covering is None:
        return runs.exclude(config__has_key="item_ids").order_by("-ended_at", "-pk").first()
    wanted = sorted({int(pk) for pk in covering})
    # jsonb containment: a run's item_ids hold every wanted id, in any order
    return runs.filter(Q(config__contains={"item_ids": wanted}) | ~Q(config__has_key="item_ids")) \
        .order_by("-ended_at", "-pk").first()


def run_scores(run: EvalRun, *, current_only: bool = True) -> dict[int, float | None]:
    """Per-item scores of an eval run ({item id: score}; None for a grading error). With
    `current_only`, only results graded on the item's present contents with the set's present graders
    and judge (their reuse key is today's): a result of an edited item is no evidence about it."""
    results = GoldenResult.objects.filter(eval_run=run)
    if not current_only:
        return dict(results.values_list("golden_item_id", "score"))
    from evals.conf import eval_settings
    from evals.execution import grading_digest, reuse_key
    from evals.graders import GraderConfigError, validate_graders

    golden = run.golden_set
    try:
        digest = grading_digest(validate_graders(golden.graders), eval_settings().judge_model)
    except GraderConfigError:
        return {}
    hashes = dict(golden.items.values_list("pk", "content_hash"))
    return {item: score for item, score, key in results.values_list("golden_item_id", "score", "reuse_key")
            if item in hashes and key == reuse_key(run.workflow_version_id, hashes[item], digest)}


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


def split_plan(golden_set: GoldenSet, *, counts: dict[str, int] | None = None) -> splits.SplitPlan:
    """The set's items per split and whether they can carry a held-out claim (`held_out`, else `reason`: too few
    items, EVAL_MIN_SPLIT_ITEMS, or a split under its minimum), with the counts of each stratum (first tag).
    Given `counts` (a list's annotations), no query: the plan without strata."""
    from evals.conf import eval_settings

    conf = eval_settings()
    strata = None
    if counts is None:
        by_stratum: dict[str, Counter] = defaultdict(Counter)
        for tags, split in GoldenItem.objects.filter(golden_set=golden_set).values_list("tags", "split").iterator():
            by_stratum[splits.stratum_of(tags)][split] += 1
        counts = sum(by_stratum.values(), Counter())
        strata = by_stratum
    return splits.plan(counts, proportions=conf.split_proportions, min_items=conf.min_split_items, strata=strata)


def split_items(golden_set: GoldenSet) -> dict[str, list[int]]:
    """The ids of the set's items in each split, in the set's order (what a search, a selection and a held-out
    report each read)."""
    ids: dict[str, list[int]] = {split: [] for split in splits.SPLITS}
    for pk, split in GoldenItem.objects.filter(golden_set=golden_set).order_by("position", "pk") \
            .values_list("pk", "split"):
        ids[split].append(pk)
    return ids

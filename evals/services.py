"""Writes of the evals app: golden sets and items, eval runs, promotion and rollback."""

from __future__ import annotations

from collections.abc import Iterable
from decimal import Decimal
from typing import TYPE_CHECKING

from django.db import transaction
from django.db.models import Max

from config.errors import Conflict, Invalid
from evals import splits
from evals.conf import MAX_CONCURRENCY, eval_settings
from evals.models import EvalRun, GoldenItem, GoldenSet, Promotion, item_content_hash
from evals.stats import Comparison, paired_comparison
from workflows.models import Workflow, WorkflowVersion

if TYPE_CHECKING:
    from evals.importing import ImportLine


class EvalError(Invalid):
    """A request that cannot be carried out; `errors` maps a field to its messages."""


class PromotionRefused(Conflict, EvalError):
    """A promotion the evidence does not support; `evidence` says why (the API's 409 body carries it)."""

    code = "promotion_refused"

    def __init__(self, message: str, evidence: dict):
        super().__init__({"promotion": [message]})
        self.evidence = evidence
        self.details = {"evidence": evidence}


class GoldenSetBusy(Conflict, EvalError):
    """A change of a set's items while an eval run of it is queued or running."""

    def __init__(self, golden_set_id: int):
        message = (f"An eval run of golden set {golden_set_id} is in progress; change its items once it has "
                   "ended (or cancel it).")
        super().__init__({"items": [message]})
        self.message = message


# ------------------------------------------------------------------------------------------ golden sets

def golden_set_ensure_idle(*, golden_set_id: int) -> None:
    """Refuse (GoldenSetBusy) a change or deletion of a set's items, or of the set, while an eval run of it is
    queued or running: its results are keyed on the contents it started with. Call it in the transaction
    that writes the change; the API answers 409, the admin shows the message and saves nothing."""
    if EvalRun.objects.filter(golden_set_id=golden_set_id, status__in=EvalRun.ACTIVE).exists():
        raise GoldenSetBusy(golden_set_id)


def golden_set_create(*, workspace, name: str, workflow: Workflow | None = None, description: str = "",
                      graders=None, pass_threshold: float = 0.7, created_by=None) -> GoldenSet:
    from evals.graders import GraderConfigError, validate_graders

    if workflow is not None and workflow.workspace_id != workspace.pk:
        raise EvalError({"workflow": ["belongs to another workspace"]})
    try:
        graders = validate_graders(graders if graders is not None else [{"kind": "llm_judge", "weight": 1.0}])
    except GraderConfigError as exc:
        raise EvalError(exc.errors) from None
    if not isinstance(pass_threshold, int | float) or isinstance(pass_threshold, bool) or not 0 <= pass_threshold <= 1:
        raise EvalError({"pass_threshold": ["must be a number from 0 to 1"]})
    return GoldenSet.objects.create(workspace=workspace, name=name, workflow=workflow, description=description,
                                    graders=graders, pass_threshold=float(pass_threshold), created_by=created_by)


def golden_item_add(*, golden_set: GoldenSet, input, expected_output: str = "", scoring_criteria: str = "",
                    rubric=None, tags=None, metadata=None, position: int | None = None,
                    split: str | None = None) -> GoldenItem:
    """Add an item (after the set's last one unless `position` is given), in `split` or, without one, in the split
    evals/splits.py deals it (after the set's other items: theirs never change); EvalError naming the field when
    an item field is bad, or on "golden_set" when the set already holds EVAL_MAX_ITEMS_PER_SET items."""
    errors = item_errors(input=input, expected_output=expected_output, scoring_criteria=scoring_criteria,
                         rubric=rubric, tags=tags, metadata=metadata, split=split)
    if errors:
        raise EvalError(errors)
    with transaction.atomic():
        _lock_with_room(golden_set, adding=1, field="golden_set")
        if position is None:
            last = GoldenItem.objects.filter(golden_set=golden_set).aggregate(last=Max("position"))["last"]
            position = (last or 0) + 1
        item = GoldenItem(golden_set=golden_set, input=input, expected_output=expected_output or "",
                          scoring_criteria=scoring_criteria or "", rubric=rubric or [], tags=tags or [],
                          metadata=metadata or {}, position=position, split=split or "")
        golden_items_deal_splits(golden_set=golden_set, items=[item])
        item.save()
        return item


def golden_items_deal_splits(*, golden_set: GoldenSet, items: list[GoldenItem]) -> None:
    """Give each of `items` (new items of `golden_set`, in their order) without a split the one evals/splits.py
    deals it after the set's present items, those of `items` that have one counted as they come. Call it in the
    transaction that saves them: it locks the set's row until that commits, so two writers dealing at once (an
    import, an item added in the admin) do not both count the same items; the second deals after the first's."""
    GoldenSet.objects.select_for_update().filter(pk=golden_set.pk).values_list("pk").first()
    conf = eval_settings()
    present = GoldenItem.objects.filter(golden_set=golden_set).values_list("tags", "split")
    dealer = splits.dealer(seed=golden_set.name, proportions=conf.split_proportions, min_items=conf.min_split_items,
                           existing=((splits.stratum_of(tags), split) for tags, split in present.iterator()))
    for item in items:
        stratum = splits.stratum_of(item.tags)
        if item.split:
            dealer.seen(stratum, item.split)
            continue
        content_hash = item_content_hash(item.input, item.expected_output, item.scoring_criteria, item.rubric)
        item.split = dealer.deal(stratum, splits.item_key(item.metadata, content_hash))


def _lock_with_room(golden_set: GoldenSet, *, adding: int, field: str) -> None:
    """Lock the set's row (two writers cannot both take the last places, nor the same positions) and refuse,
    naming `field`, items past EVAL_MAX_ITEMS_PER_SET: every comparison holds a set's scores in memory."""
    GoldenSet.objects.select_for_update().filter(pk=golden_set.pk).values_list("pk").first()
    limit = eval_settings().max_items_per_set
    held = GoldenItem.objects.filter(golden_set=golden_set).count()
    if held + adding > limit:
        raise EvalError({field: [f"a golden set holds at most {limit:,} items (EVAL_MAX_ITEMS_PER_SET); this one has "
                                 f"{held:,}, so {adding:,} more would be too many"]})


def item_errors(*, input, expected_output, scoring_criteria, rubric, tags, metadata,
                split=None) -> dict[str, list[str]]:
    """What is wrong with an item's fields, by field (empty when nothing is); an empty `split` is one to deal."""
    errors: dict[str, list[str]] = {}
    if input is None or input == "" or input == {}:
        errors["input"] = ["is required"]
    if not isinstance(expected_output or "", str):
        errors["expected_output"] = ["must be text (JSON as its text)"]
    if not isinstance(scoring_criteria or "", str):
        errors["scoring_criteria"] = ["must be text"]
    if rubric and (not isinstance(rubric, list) or not all(
            isinstance(c, dict) and isinstance(c.get("criterion"), str) and c["criterion"].strip()
            and isinstance(c.get("max_points"), int | float) and not isinstance(c.get("max_points"), bool)
            and 0 < c["max_points"] <= 1000 for c in rubric)):
        errors["rubric"] = ['must be a list of {"criterion": text, "max_points": a number from 0 to 1000}']
    if tags and (not isinstance(tags, list) or not all(isinstance(t, str) and 0 < len(t) <= 50 for t in tags)):
        errors["tags"] = ["must be a list of short names"]
    if metadata and not isinstance(metadata, dict):
        errors["metadata"] = ["must be an object"]
    if split not in (None, "") and split not in splits.SPLITS:
        errors["split"] = [f"must be one of {', '.join(splits.SPLITS)} (or empty: dealt by the item's first tag)"]
    return errors


# ---------------------------------------------------------------------------------------------- eval runs

def eval_run_prepare(*, golden_set: GoldenSet, version: WorkflowVersion, user=None, reuse: bool = True,
                     origin: str = EvalRun.Origin.MANUAL, concurrency: int | None = None,
                     node_budget: int | None = None, usd_budget=None, item_ids: list[int] | None = None,
                     parent_run_id: str | None = None, run_usd_budget: Decimal | None = None) -> EvalRun:
    """Validate and write an eval run (queued, no durable run yet): what `eval_run_start` starts, and
    what a parent run (a re-evaluation, an evolution: `parent_run_id`) runs as its child. EvalError
    when the set has no items, the version is of another workspace or cannot run here (missing tools
    or models). `item_ids` restricts the run to those items of the set (a minibatch); `usd_budget` is
    each item invocation's budget, `run_usd_budget` what the whole run may spend (its invocations and
    judge; it starts no more items once that is spent)."""
    from evals.graders import GraderConfigError, validate_graders
    from workflows.conf import workflow_settings
    from workflows.services import version_problems

    conf = eval_settings()
    errors: dict[str, list[str]] = {}
    if version.workflow.workspace_id != golden_set.workspace_id:
        errors["workflow_version"] = ["belongs to another workspace"]
    items = GoldenItem.objects.filter(golden_set=golden_set)
    if item_ids is not None:
        items = items.filter(pk__in=item_ids)
    if not items.exists():
        errors["golden_set"] = ["has no items" if item_ids is None else "has none of the items asked for"]
    try:
        graders = validate_graders(golden_set.graders)
    except GraderConfigError as exc:
        errors.update({f"golden_set.{key}": value for key, value in exc.errors.items()})
        graders = []
    if concurrency is not None and (not isinstance(concurrency, int) or isinstance(concurrency, bool)
                                    or not 1 <= concurrency <= MAX_CONCURRENCY):
        errors["concurrency"] = [f"must be a whole number from 1 to {MAX_CONCURRENCY}"]
    if not errors:
        errors.update(version_problems(version))
    if errors:
        raise EvalError(errors)
    wf = workflow_settings()
    config = {"graders": graders, "threshold": golden_set.pass_threshold, "judge_model": conf.judge_model,
              "concurrency": concurrency or conf.concurrency, "node_budget": node_budget or wf.node_budget,
              "usd_budget": f"{usd_budget if usd_budget is not None else wf.usd_budget}"}
    if item_ids is not None:
        config["item_ids"] = sorted(int(pk) for pk in item_ids)
    if run_usd_budget is not None:
        config["run_usd_budget"] = f"{Decimal(run_usd_budget):f}"
    return EvalRun.objects.create(workspace=golden_set.workspace, golden_set=golden_set, workflow_version=version,
                                  reuse=reuse, origin=origin, config=config, parent_run_id=parent_run_id,
                                  created_by=user if getattr(user, "pk", None) else None)


def eval_run_start(*, golden_set: GoldenSet, version: WorkflowVersion, user=None, reuse: bool = True,
                   origin: str = EvalRun.Origin.MANUAL, concurrency: int | None = None,
                   node_budget: int | None = None, usd_budget=None) -> EvalRun:
    """Start an eval run of `version` on `golden_set` (a durable run; the worker does the rest).
    Refused (EvalError) as `eval_run_prepare` says."""
    from durable.services import run_start
    from evals.durable_workflows import EVAL_WORKFLOW

    with transaction.atomic():
        run = eval_run_prepare(golden_set=golden_set, version=version, user=user, reuse=reuse, origin=origin,
                               concurrency=concurrency, node_budget=node_budget, usd_budget=usd_budget)
        durable = run_start(workflow=EVAL_WORKFLOW, input={"eval_run_id": run.pk}, run_id=f"eval-{run.pk}",
                            namespace=golden_set.workspace.namespace, tags=["eval", f"golden_set:{golden_set.pk}"])
        run.durable_run_id = durable.pk
        run.save(update_fields=["durable_run", "updated_at"])
    return run


def eval_run_cancel(*, eval_run: EvalRun, reason: str = "cancelled by an operator") -> bool:
    from durable import owners
    from durable.services import run_cancel

    if eval_run.status in EvalRun.TERMINAL:
        return False
    cancelled = run_cancel(run_id=eval_run.durable_run_id, reason=reason) if eval_run.durable_run_id else True
    if cancelled:
        owners.fail(EvalRun, eval_run.pk, reason, status=EvalRun.Status.CANCELLED)
    eval_run.refresh_from_db()
    return cancelled


# ------------------------------------------------------------------------------------- compare, promote

def compare_versions(*, golden_set: GoldenSet, version_a: WorkflowVersion, version_b: WorkflowVersion,
                     alpha: float | None = None, item_ids: list[int] | None = None) -> dict:
    """The paired comparison of two versions on a set, from each one's latest completed eval run on
    it: per-item scores side by side (items both runs graded), the test, and the critical items
    that b scores lower than a by more than the tolerance. With `item_ids`, on those items alone, from each
    one's latest completed run that covers them (the evidence names them)."""
    from evals.selectors import latest_completed_run, run_scores

    conf = eval_settings()
    alpha = conf.alpha if alpha is None else alpha
    covering = {} if item_ids is None else {"covering": item_ids}
    run_a = latest_completed_run(golden_set=golden_set, version=version_a, **covering)
    run_b = latest_completed_run(golden_set=golden_set, version=version_b, **covering)
    missing = [str(v.pk) for v, r in ((version_a, run_a), (version_b, run_b)) if r is None]
    if missing:
        where = "this set" if item_ids is None else "these items of the set"
        raise EvalError({"versions": [f"version {pk} has no completed eval run on {where}" for pk in missing]})
    scores_a, scores_b = run_scores(run_a), run_scores(run_b)
    items = GoldenItem.objects.filter(golden_set=golden_set)
    if item_ids is not None:
        items = items.filter(pk__in=item_ids)
    items = {item.pk: item for item in items}
    paired = [pk for pk in sorted(items, key=lambda pk: (items[pk].position, pk))
              if scores_a.get(pk) is not None and scores_b.get(pk) is not None]
    comparison: Comparison = paired_comparison([scores_a[pk] for pk in paired], [scores_b[pk] for pk in paired],
                                               alpha=alpha, resamples=conf.bootstrap_resamples)
    critical = [{"item": pk, "a": scores_a[pk], "b": scores_b[pk]} for pk in paired
                if items[pk].critical and scores_b[pk] < scores_a[pk] - conf.critical_tolerance]
    # a critical item a answered and b has no current score for (ungraded, or its run is stale) blocks too
    critical += [{"item": pk, "a": scores_a[pk], "b": None} for pk in items
                 if items[pk].critical and scores_a.get(pk) is not None and scores_b.get(pk) is None]
    return {"golden_set": golden_set.pk, "version_a": version_a.pk, "version_b": version_b.pk,
            **({} if item_ids is None else {"item_ids": sorted(items)}),
            "eval_run_a": run_a.pk, "eval_run_b": run_b.pk, "comparison": comparison.as_dict(),
            "critical_regressions": critical, "critical_tolerance": conf.critical_tolerance,
            "items": [{"item": pk, "a": scores_a.get(pk), "b": scores_b.get(pk), "critical": items[pk].critical}
                      for pk in sorted(items, key=lambda pk: (items[pk].position, pk))]}


def version_promote(*, candidate: WorkflowVersion, golden_set: GoldenSet, user=None, alpha: float | None = None,
                    force_first: bool = True, item_ids: list[int] | None = None) -> Promotion:
    """Make `candidate` the active version when the evidence supports it: significantly better than
    the active version on `golden_set` (paired test, p < alpha) and no critical item regressed beyond
    the tolerance; with `item_ids`, on those items alone (compare_versions). Activation and its evidence
    are written in one transaction; a concurrent activation of the same workflow makes this one refuse
    (compare again). With no active version, the candidate is activated on its own eval run (`force_first`)."""
    from workflows.services import workflow_version_activate

    if candidate.status == WorkflowVersion.Status.ACTIVE:
        raise EvalError({"workflow_version": ["is already the active version"]})
    if golden_set.workspace_id != candidate.workflow.workspace_id:
        raise EvalError({"golden_set": ["belongs to another workspace"]})
    active = WorkflowVersion.objects.filter(workflow_id=candidate.workflow_id,
                                            status=WorkflowVersion.Status.ACTIVE).first()
    if active is None:
        if not force_first:
            raise EvalError({"workflow": ["has no active version to compare with"]})
        from evals.selectors import latest_completed_run

        run = latest_completed_run(golden_set=golden_set, version=candidate,
                                   **({} if item_ids is None else {"covering": item_ids}))
        if run is None:
            raise EvalError({"workflow_version": ["has no completed eval run on this set"]})
        evidence = {"first_version": True, "eval_run": run.pk, "avg_score": run.avg_score, "pass_rate": run.pass_rate,
                    **({} if item_ids is None else {"item_ids": sorted(int(pk) for pk in item_ids)})}
    else:
        evidence = compare_versions(golden_set=golden_set, version_a=active, version_b=candidate, alpha=alpha,
                                    item_ids=item_ids)
        verdict = evidence["comparison"]["verdict"]
        if verdict != "better":
            raise PromotionRefused(
                f"the candidate is not significantly better than the active version ({verdict}, "
                f"p={evidence['comparison']['p_value']}, alpha={evidence['comparison']['alpha']})", evidence)
        if evidence["critical_regressions"]:
            raise PromotionRefused(f"{len(evidence['critical_regressions'])} critical item(s) regressed", evidence)
    with transaction.atomic():
        Workflow.objects.select_for_update().get(pk=candidate.workflow_id)
        current = WorkflowVersion.objects.filter(workflow_id=candidate.workflow_id,
                                                 status=WorkflowVersion.Status.ACTIVE).values_list("pk", flat=True)
        if list(current) != ([active.pk] if active else []):
            raise EvalError({"workflow": ["the active version changed while comparing: compare again"]})
        workflow_version_activate(version=candidate, user=user)
        promotion = Promotion.objects.create(workflow_id=candidate.workflow_id, workflow_version=candidate,
                                             previous_version=active, golden_set=golden_set,
                                             action=Promotion.Action.PROMOTE, evidence=evidence,
                                             decided_by=user if getattr(user, "pk", None) else None)
    return promotion


def version_rollback(*, workflow: Workflow, user=None) -> Promotion:
    """Re-activate the version that was active before the current one, by the workflow's activation
    history (``workflows.services.workflow_version_rollback``: repeated rollbacks walk back one activation
    each), and record it as a rollback. EvalError naming `workflow` when there is no earlier version."""
    from workflows.services import workflow_version_rollback

    with transaction.atomic():
        activation = workflow_version_rollback(workflow=workflow, user=user)
        if activation is None:
            raise EvalError({"workflow": ["has no earlier active version to roll back to"]})
        return Promotion.objects.create(workflow=workflow, workflow_version=activation.workflow_version,
                                        previous_version=activation.previous_version,
                                        action=Promotion.Action.ROLLBACK,
                                        evidence={"rolled_back_from": activation.previous_version_id,
                                                  "activation": activation.pk},
                                        decided_by=user if getattr(user, "pk", None) else None)


def reevaluation_schedule_save(*, workspace, cron: str = "0 3 * * *", timezone_name: str = "UTC",
                               paused: bool = False):
    """The durable schedule that re-evaluates the workspace's active versions (nightly at 03:00 UTC by
    default) and flags a significant drop on the new eval run. One per workspace; saving again updates it."""
    from durable.services import schedule_save
    from evals.durable_workflows import REEVALUATE_WORKFLOW

    return schedule_save(key="evals-reevaluate", workflow=REEVALUATE_WORKFLOW, namespace=workspace.namespace,
                         cron=cron, timezone_name=timezone_name, paused=paused, overlap="skip",
                         tags=["eval", "schedule"])


# ------------------------------------------------------------------------------------------------ import

def golden_items_import(*, golden_set: GoldenSet, items: Iterable[ImportLine], partial: bool = False,
                        field: str = "file") -> tuple[list[GoldenItem], list[dict]]:
    """Append an import's items to `golden_set` after its last item, in line order, in one transaction.

    `items` are read by `evals.importing` (`read_file`, `read_objects`), which checked each one (`item_errors`
    and the length caps) and kept its problems: a line with errors is reported, never written. All or nothing:
    a bad line writes nothing unless `partial`, which writes the good ones; no good line writes nothing either
    way. Returns (the items written, {"line", "fields"} for each bad line). The set's row is locked while the
    positions are taken and the splits dealt (a line's `split`, else evals/splits.py's), so two imports into one
    set do not interleave. Items that would take the set past
    EVAL_MAX_ITEMS_PER_SET write nothing: EvalError on `field` (what the caller sent them as)."""
    items = list(items)
    good = [item for item in items if not item.errors]
    errors = [item.error_entry() for item in items if item.errors]
    if not good or (errors and not partial):
        return [], errors
    rows = []
    for item in good:
        values = item.values
        row = GoldenItem(golden_set=golden_set, input=values["input"],
                         expected_output=values.get("expected_output") or "",
                         scoring_criteria=values.get("scoring_criteria") or "", rubric=values.get("rubric") or [],
                         tags=values.get("tags") or [], metadata=values.get("metadata") or {},
                         split=values.get("split") or "")
        # bulk_create skips save(), which computes the hash
        row.content_hash = item_content_hash(row.input, row.expected_output, row.scoring_criteria, row.rubric)
        rows.append(row)
    with transaction.atomic():
        _lock_with_room(golden_set, adding=len(rows), field=field)
        last = GoldenItem.objects.filter(golden_set=golden_set).aggregate(last=Max("position"))["last"] or 0
        for position, row in enumerate(rows, start=last + 1):
            row.position = position
        golden_items_deal_splits(golden_set=golden_set, items=rows)
        created = GoldenItem.objects.bulk_create(rows, batch_size=1000)
    return created, errors

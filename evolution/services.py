"""Writes of the evolution app: start, pause, resume, cancel an evolution run; promote its best."""

from __future__ import annotations

from django.db import transaction

from config.errors import Invalid
from evals.models import GoldenSet
from evolution.conf import evolution_config
from evolution.models import EvolutionRun
from workflows.models import Workflow, WorkflowVersion


class EvolutionError(Invalid):
    """A request that cannot be carried out; `errors` maps a field to its messages."""


def evolution_start(*, workflow: Workflow, golden_set: GoldenSet, mode: str = EvolutionRun.Mode.GP,
                    base_version: WorkflowVersion | None = None, config: dict | None = None, goal: str = "",
                    user=None) -> EvolutionRun:
    """Start evolving `workflow` against `golden_set` (a durable run). The base is `base_version`, else
    the active version, else the newest version an evolution did not breed. EvolutionError names each
    field at fault."""
    from durable.services import run_start
    from evolution.durable_workflows import EVOLVE_WORKFLOW
    from workflows import dsl
    from workflows.services import version_problems

    errors: dict[str, list[str]] = {}
    if mode not in EvolutionRun.Mode.values:
        errors["mode"] = [f"must be one of {', '.join(EvolutionRun.Mode.values)}"]
    if golden_set.workspace_id != workflow.workspace_id:
        errors["golden_set"] = ["belongs to another workspace"]
    elif not golden_set.items.exists():
        errors["golden_set"] = ["has no items"]
    if base_version is None:  # the active version, else the newest one not bred by an evolution
        versions = WorkflowVersion.objects.filter(workflow=workflow)
        base_version = (versions.filter(status=WorkflowVersion.Status.ACTIVE).first()
                        or versions.filter(generation__isnull=True).order_by("-created_at", "-pk").first()
                        or versions.order_by("-created_at", "-pk").first())
    if base_version is None:
        errors["workflow"] = ["has no version to evolve"]
    elif base_version.workflow_id != workflow.pk:
        errors["base_version"] = ["belongs to another workflow"]
    settings_, config_errors = evolution_config(config)
    errors.update(config_errors)
    if not isinstance(goal, str) or len(goal) > 10_000:
        errors["goal"] = ["must be text of at most 10,000 characters"]
    if not errors:
        errors.update({f"base_version.{key}": value for key, value in version_problems(base_version).items()})
        try:  # every version the run writes is derived from the base's DSL: one stored before a check refuses it
            dsl.validate(base_version.dsl)
        except dsl.DslError as exc:
            errors.update({f"base_version.dsl.{path}": messages for path, messages in exc.errors.items()})
    if errors:
        raise EvolutionError(errors)
    with transaction.atomic():
        run = EvolutionRun.objects.create(workspace=workflow.workspace, workflow=workflow, golden_set=golden_set,
                                          base_version=base_version, mode=mode, config=settings_, goal_text=goal,
                                          created_by=user if getattr(user, "pk", None) else None)
        durable = run_start(workflow=EVOLVE_WORKFLOW, input={"evolution_run_id": run.pk}, run_id=f"evo-{run.pk}",
                            namespace=workflow.workspace.namespace, tags=["evolution", f"workflow:{workflow.pk}"])
        run.durable_run_id = durable.pk
        run.save(update_fields=["durable_run", "updated_at"])
    return run


def evolution_pause(*, run: EvolutionRun) -> EvolutionRun:
    """Pause at the next generation boundary (the generation under way finishes first)."""
    with transaction.atomic():
        locked = EvolutionRun.objects.select_for_update().get(pk=run.pk)
        if locked.status not in (EvolutionRun.Status.QUEUED, EvolutionRun.Status.RUNNING):
            raise EvolutionError({"status": [f"a {locked.status} run cannot be paused"]})
        locked.status = EvolutionRun.Status.PAUSED
        locked.save(update_fields=["status", "updated_at"])
    run.refresh_from_db()
    return run


def evolution_resume(*, run: EvolutionRun) -> EvolutionRun:
    """Resume a paused run: the signal goes to the boundary it waits at; a run paused before reaching
    a boundary simply goes on."""
    from durable.services import signal_send

    with transaction.atomic():
        locked = EvolutionRun.objects.select_for_update().get(pk=run.pk)
        if locked.status != EvolutionRun.Status.PAUSED:
            raise EvolutionError({"status": [f"a {locked.status} run is not paused"]})
        boundary = locked.paused_at
        locked.status, locked.paused_at = EvolutionRun.Status.RUNNING, ""
        locked.save(update_fields=["status", "paused_at", "updated_at"])
        if boundary:
            signal_send(run_id=locked.durable_run_id, name=f"resume:{boundary}", payload={})
    run.refresh_from_db()
    return run


def evolution_cancel(*, run: EvolutionRun, reason: str = "cancelled by an operator") -> bool:
    """Cancel the run, its eval runs under way included. False when it had already ended."""
    from durable import owners
    from durable.services import run_cancel

    if run.status in EvolutionRun.TERMINAL:
        return False
    cancelled = run_cancel(run_id=run.durable_run_id, reason=reason) if run.durable_run_id else True
    if cancelled:
        owners.fail(EvolutionRun, run.pk, reason, status=EvolutionRun.Status.CANCELLED)
    run.refresh_from_db()
    return cancelled


def evolution_promote_best(*, run: EvolutionRun, user=None):
    """Promote the run's best version through the evals lifecycle (evals.services.version_promote: significantly
    better than the active version, paired Wilcoxon test, no critical item regressed), judged on evidence the
    search did not select on:

    - a run with a held-out claim: on its test split alone (the items its report scored base and best on, which
      nothing in the search read), from each version's latest completed eval run covering them;
    - a run without one (a set too small to split, or a run from before splits): its best was chosen on the
      very items a comparison of the whole set reads, so it is refused unless a fresh eval run of the whole set
      backs it: the best's latest completed run of the set (the one evals' promotion reads) started after the
      evolution ended and reused no result (every item answered again; reused results would be the search's
      own). The operator runs it (reuse off), then promotes; the comparison is then evals' on the whole set.
    """
    from evals.selectors import latest_completed_run
    from evals.services import version_promote

    if run.best_version is None:
        raise EvolutionError({"best_version": ["the run has no best version yet"]})
    report = run.report or {}
    test = report.get("test") or {}
    if report.get("held_out") and test.get("item_ids"):
        return version_promote(candidate=run.best_version, golden_set=run.golden_set, user=user,
                               item_ids=test["item_ids"])
    if report.get("held_out"):
        raise EvolutionError({"report": ["the run's test split has not been scored yet"]
                              if run.status not in EvolutionRun.TERMINAL else
                              [report.get("test_error") or "the run's test split was not scored"]})
    fresh = latest_completed_run(golden_set=run.golden_set, version=run.best_version)
    if fresh is None or fresh.reuse or run.ended_at is None or fresh.created_at <= run.ended_at:
        raise EvolutionError({"report": [
            "the run has no held-out claim: its best was selected on the items a promotion would judge it on. Run "
            "an eval of the best version on the whole set without reusing results, then promote"]})
    return version_promote(candidate=run.best_version, golden_set=run.golden_set, user=user)

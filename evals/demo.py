"""Demo data for `manage.py seed_demo`: the 7 canonical agents with their golden sets in the demo
workspace, a nightly re-evaluation schedule, and one eval run of each agent's active version,
started as durable runs the worker finishes in the background (Evaluations > Eval runs)."""

from __future__ import annotations

from evals.agents import seed_agents
from evals.models import EvalRun, GoldenSet
from evals.services import EvalError, eval_run_start, reevaluation_schedule_save
from workflows.models import WorkflowVersion


def seed(stdout) -> None:
    from workspaces.demo import demo_workspace

    workspace = demo_workspace()
    report = seed_agents(workspace=workspace)
    changed = sum(outcome.changed for outcome in report.agents)
    stdout.write(f"evals: {len(report.agents)} canonical agents in {workspace.slug!r}, {changed} changed")
    reevaluation_schedule_save(workspace=workspace, paused=True)
    started = 0
    for golden in GoldenSet.objects.filter(workspace=workspace, workflow__isnull=False).select_related("workspace"):
        version = WorkflowVersion.objects.filter(workflow_id=golden.workflow_id, status="active") \
            .select_related("workflow").first()
        if version is None or EvalRun.objects.filter(golden_set=golden, workflow_version=version).exists():
            continue
        try:
            eval_run_start(golden_set=golden, version=version, origin=EvalRun.Origin.DEMO)
            started += 1
        except EvalError as exc:
            stdout.write(f"evals: {golden.name}: not evaluated: {exc}")
    stdout.write(f"evals: {started} eval run(s) started (the worker runs them); nightly re-evaluation "
                 "schedule saved, paused")

"""Demo data for `manage.py seed_demo`: one evolution run of a canonical agent (the Research Analyst,
offline GP, 4 generations of 6), started as a durable run the worker finishes in the background
(Evolution > Evolution runs: its fitness chart and genealogy)."""

from __future__ import annotations

from evals.models import GoldenSet
from evolution.models import EvolutionRun
from evolution.services import EvolutionError, evolution_start
from workflows.models import Workflow

AGENT = "Research Analyst"
CONFIG = {"population": 6, "generations": 4, "seed": 1}


def seed(stdout) -> None:
    from workspaces.demo import demo_workspace

    workspace = demo_workspace()
    workflow = Workflow.objects.filter(workspace=workspace, name=AGENT).first()
    golden = GoldenSet.objects.filter(workspace=workspace, workflow=workflow).first() if workflow else None
    if workflow is None or golden is None:
        stdout.write(f"evolution: no {AGENT!r} agent with a golden set in {workspace.slug!r}: nothing to evolve")
        return
    if EvolutionRun.objects.filter(workflow=workflow).exists():
        stdout.write(f"evolution: {AGENT!r} already has an evolution run")
        return
    try:
        run = evolution_start(workflow=workflow, golden_set=golden, config=CONFIG,
                              goal="A research report with key findings, sources and a confidence.")
    except EvolutionError as exc:
        stdout.write(f"evolution: {AGENT!r} not evolved: {exc}")
        return
    stdout.write(f"evolution: run {run.pk} of {AGENT!r} started (the worker runs it)")

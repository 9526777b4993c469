"""make run's evolution demo: one GP run of a canonical agent that completes and beats its base."""

from io import StringIO

import pytest

from durable.inprocess import run_until_settled
from evals import demo as evals_demo
from evolution import demo
from evolution.models import EvolutionRun
from knowledge import demo as knowledge_demo

pytestmark = pytest.mark.django_db


def test_the_demo_evolves_a_canonical_agent_beyond_its_base(monkeypatch):
    monkeypatch.setattr(evals_demo, "eval_run_start", lambda **kwargs: None)  # the agents' own demo runs: not here
    knowledge_demo.seed(stdout=StringIO())
    evals_demo.seed(stdout=StringIO())
    out = StringIO()
    demo.seed(stdout=out)
    demo.seed(stdout=out)  # idempotent
    assert "started" in out.getvalue() and "already has an evolution run" in out.getvalue()
    run = EvolutionRun.objects.get()
    run_until_settled(run.durable_run_id, max_wait=600)
    run.refresh_from_db()
    assert run.status == "completed", run.error
    assert run.generations_done >= 2 and run.best_fitness > run.base_fitness
    # the agent's set carries a held-out claim: the page shows the lift on items the search never read
    report = run.report
    assert report["held_out"] and report["test"]["paired"] == report["splits"]["test"] >= 8
    assert run.test_lift is not None and report["best"]["test"] is not None

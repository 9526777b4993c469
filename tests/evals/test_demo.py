"""The evals demo of `make run`: the canonical agents, a paused re-evaluation schedule, one eval run
per agent that completes."""

from io import StringIO

import pytest

from durable.inprocess import run_until_settled
from durable.models import Schedule
from evals import demo
from evals.models import EvalRun
from knowledge import demo as knowledge_demo

pytestmark = pytest.mark.django_db


def test_the_demo_seeds_the_agents_and_one_eval_run_each_that_completes():
    knowledge_demo.seed(stdout=StringIO())
    out = StringIO()
    demo.seed(stdout=out)
    demo.seed(stdout=StringIO())  # idempotent: no second eval run
    assert "7 canonical agents" in out.getvalue() and "7 eval run(s) started" in out.getvalue()
    runs = list(EvalRun.objects.order_by("pk"))
    assert len(runs) == 7 and {run.origin for run in runs} == {"demo"}
    for run in runs:
        run_until_settled(run.durable_run_id, max_wait=120)
        run.refresh_from_db()
        assert run.status == "completed", run.error
        assert 0 < run.avg_score < 1  # room to improve
    schedule = Schedule.objects.get(key="evals-reevaluate")
    assert schedule.paused

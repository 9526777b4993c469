"""Review of 5642269: an evolution of a base version stored before its inputSchema was checked as it is written
(371c8fd), with a schema that check now refuses: every child the operators derive from it is refused."""

import pytest

from durable.inprocess import run_until_settled
from evolution.services import EvolutionError, evolution_start
from tests.evals.test_rewrite_of_a_stored_schema import stored_before_the_check

pytestmark = pytest.mark.django_db


def test_an_evolution_of_a_base_whose_stored_schema_is_now_refused_is_refused_at_its_start(support_set, workspace):
    # evolution_start checks the base's tools and models (version_problems), not that its DSL still validates;
    # the run starts and its first step, the initial population, fails on operators.mutate's parse of the base
    base = stored_before_the_check(workspace, name="support")
    try:
        run = evolution_start(workflow=base.workflow, golden_set=support_set,
                              config={"population": 2, "generations": 1, "seed": 7})
    except EvolutionError as refused:
        assert any("inputSchema" in " ".join(messages) or "inputSchema" in field
                   for field, messages in refused.errors.items()), refused.errors
        return
    run_until_settled(run.durable_run_id, max_wait=120)
    run.refresh_from_db()
    pytest.fail(f"the evolution started and ended {run.status}: {run.error[:300]}")

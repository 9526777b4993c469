import pytest

from tests.evals.conftest import ITEMS, evaluate, facts, support_set  # noqa: F401  (shared fixtures)


@pytest.fixture
def support_base(make_version):
    """A support agent that answers without looking anything up (room to improve)."""
    from tests.workflows.conftest import graph, node

    return make_version(graph("agent", node("agent", prompt="You are a helpful support agent.")), name="support")


@pytest.fixture
def evolve():
    """Start an evolution run and drive it (and its eval runs and invocations) in-process."""
    from durable.inprocess import run_until_settled
    from evolution.services import evolution_start

    def run(workflow, golden_set, **kwargs):
        evolution = evolution_start(workflow=workflow, golden_set=golden_set, **kwargs)
        run_until_settled(evolution.durable_run_id, max_wait=300)
        evolution.refresh_from_db()
        return evolution

    return run

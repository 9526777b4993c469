"""Two promotions of one workflow at once: exactly one wins; the other is refused, nothing half-done."""

import threading

import pytest

from evals import services
from evals.models import EvalRun, GoldenResult, Promotion
from evals.services import EvalError, golden_item_add, golden_set_create, version_promote
from tests.builders import graph, node
from tests.durable.concurrency import in_thread
from tests.evals.conftest import result_key
from workflows.models import WorkflowVersion
from workflows.services import workflow_create, workflow_version_activate, workflow_version_create


def _completed_run(golden, version, scores):
    run = EvalRun.objects.create(workspace=golden.workspace, golden_set=golden, workflow_version=version,
                                 status="completed", config={})
    for item, score in zip(golden.items.order_by("position"), scores, strict=True):
        GoldenResult.objects.create(eval_run=run, golden_item=item, workflow_version=version, score=score,
                                    passed=score >= 0.7, reuse_key=result_key(golden, version, item))
    return run


@pytest.mark.django_db(transaction=True)
def test_concurrent_promotions_leave_one_active_version_and_one_promotion(workspace, monkeypatch):
    workflow = workflow_create(workspace=workspace, name="race")
    base, first, second = (workflow_version_create(workflow=workflow, dsl=graph("a", node("a", prompt=p)))[0]
                           for p in ("base", "first", "second"))
    workflow_version_activate(version=base)
    golden = golden_set_create(workspace=workspace, name="race set", graders=[{"kind": "exact"}])
    for n in range(8):
        golden_item_add(golden_set=golden, input={"text": f"q{n}"}, expected_output="x")
    _completed_run(golden, base, [0.1 * n / 8 for n in range(8)])
    _completed_run(golden, first, [0.9 - 0.01 * n for n in range(8)])
    _completed_run(golden, second, [0.95 - 0.01 * n for n in range(8)])
    both_compared = threading.Barrier(2)
    compare = services.compare_versions

    def compare_then_wait(**kwargs):
        evidence = compare(**kwargs)
        both_compared.wait(10)  # both have compared against the same active version before either activates
        return evidence

    monkeypatch.setattr(services, "compare_versions", compare_then_wait)
    threads = [in_thread(lambda v=v: version_promote(candidate=v, golden_set=golden)) for v in (first, second)]
    for thread, _ in threads:
        thread.join(30)
    assert not any(thread.is_alive() for thread, _ in threads)
    outcomes = [outcome for _, outcome in threads]
    wins = [o for o in outcomes if "value" in o]
    losses = [o for o in outcomes if "error" in o]
    assert len(wins) == 1 and len(losses) == 1
    assert isinstance(losses[0]["error"], EvalError) and "changed while comparing" in str(losses[0]["error"])
    statuses = dict(WorkflowVersion.objects.filter(workflow=workflow).values_list("pk", "status"))
    assert list(statuses.values()).count("active") == 1 and statuses[base.pk] == "archived"
    assert Promotion.objects.count() == 1 and Promotion.objects.get().workflow_version.status == "active"

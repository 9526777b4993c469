"""Eval runs: durable, graded, aggregated, reused; comparison, promotion and rollback."""

from collections import Counter
from types import SimpleNamespace

import pytest

from durable.models import DurableRun
from evals.models import EvalRun, GoldenResult, Promotion
from evals.selectors import score_histogram
from evals.services import (
    EvalError,
    PromotionRefused,
    compare_versions,
    eval_run_prepare,
    eval_run_start,
    golden_item_add,
    golden_set_create,
    version_promote,
    version_rollback,
)
from workflows.models import WorkflowInvocation, WorkflowVersion

pytestmark = pytest.mark.django_db


def test_an_eval_run_invokes_each_item_grades_it_and_aggregates(facts, support_set, support_versions, evaluate):
    _, better = support_versions
    run = evaluate(support_set, better)
    assert run.status == EvalRun.Status.COMPLETED, run.error
    results = list(GoldenResult.objects.filter(eval_run=run).select_related("workflow_invocation"))
    assert len(results) == run.items_total == run.items_done == 6
    assert all(r.workflow_invocation.status == "completed" and r.grader for r in results)
    lanes = {r.workflow_invocation.durable_run.parent for r in results}  # each item runs in one of the run's lanes
    assert {lane.workflow for lane in lanes} == {"evals.lane"}
    assert {lane.parent_id for lane in lanes} == {run.durable_run_id}
    assert all(r.workflow_invocation.parent_run_id == r.workflow_invocation.durable_run.parent_id for r in results)
    assert run.avg_score == pytest.approx(sum(r.score for r in results) / 6, abs=1e-6)
    assert run.pass_rate == pytest.approx(sum(r.passed for r in results) / 6, abs=1e-6)
    assert run.latency_p50_ms is not None and run.latency_p95_ms >= run.latency_p50_ms
    assert 0 < run.fitness <= 100 and run.grading_errors == 0
    assert sum(bin_["count"] for bin_ in score_histogram(run)) == 6
    better.refresh_from_db()
    assert better.avg_score == run.avg_score and better.pass_rate == run.pass_rate
    assert DurableRun.objects.get(pk=run.durable_run_id).status == "completed"


def test_the_same_version_set_and_graders_reuse_results_unless_asked_not_to(facts, support_set, support_versions,
                                                                           evaluate):
    base, _ = support_versions
    first = evaluate(support_set, base)
    invocations = WorkflowInvocation.objects.count()
    again = evaluate(support_set, base)
    assert again.status == "completed", (again.error, DurableRun.objects.get(pk=again.durable_run_id).error)
    assert again.items_reused == 6 and again.paid_usd == 0
    assert WorkflowInvocation.objects.count() == invocations  # nothing ran again
    assert again.avg_score == first.avg_score
    assert all(r.reused_from_id for r in GoldenResult.objects.filter(eval_run=again))
    # a changed item runs again; the others are reused
    item = support_set.items.order_by("position").first()
    item.expected_output = "Refunds take five business days, sometimes less."
    item.save()
    changed = evaluate(support_set, base)
    assert changed.items_reused == 5 and WorkflowInvocation.objects.count() == invocations + 1
    fresh = evaluate(support_set, base, reuse=False)
    assert fresh.items_reused == 0 and WorkflowInvocation.objects.count() == invocations + 7


def test_a_failure_caused_by_one_runs_budget_is_not_reused_by_a_run_with_another(facts, support_set, make_version,
                                                                              evaluate):
    """An eval run with node_budget=1 makes a two-node workflow fail on every item (score 0, not a
    grading error). A later run of the same version with the default budget must run the items again
    (the failure was the run's budget, not the genome's), not copy the zeros."""
    from tests.builders import graph, node

    two_step = make_version(graph("plan", node("plan", handoffs=["answer"], prompt="Hand off to answer."),
                                  node("answer", prompt="You are a helpful support agent.")), name="two-step")
    starved = evaluate(support_set, two_step, node_budget=1)
    assert starved.status == "completed"
    assert {r.score for r in GoldenResult.objects.filter(eval_run=starved)} == {0.0}
    assert all("budget" in r.error for r in GoldenResult.objects.filter(eval_run=starved))
    normal = evaluate(support_set, two_step)
    assert normal.status == "completed"
    assert normal.items_reused == 0, "budget failures were copied into a run with another budget"


def _looks_up(make_version):
    from tests.builders import graph, node

    return make_version(graph("agent", node("agent", tools=["knowledge_search"],
                                            prompt="You are a helpful support agent. Call knowledge_search first.")),
                        name="looks-up")


def test_results_graded_by_another_judge_model_are_not_reused(facts, workspace, make_version, evaluate, settings):
    """graders_hash does not cover the judge model (evals/graders/guide.md says so: "a caller reusing results
    must key on those too"). The reuse key holds the judge as this installation resolves it: two real
    judges differ (their results are not shared); offline, every judge model is the same deterministic
    fallback, so its results are reused."""
    from evals.execution import grading_digest
    from evals.services import golden_item_add, golden_set_create
    from tests.evals.conftest import ITEMS

    graders = [{"kind": "llm_judge", "weight": 1.0}]
    assert grading_digest(graders, "gpt-4.1-mini") == grading_digest(graders, "gpt-4.1")  # offline: one fallback
    settings.LLM_PROVIDER, settings.OPENAI_API_KEY = "openai", "sk-test"
    assert grading_digest(graders, "gpt-4.1-mini") != grading_digest(graders, "gpt-4.1")
    settings.LLM_PROVIDER, settings.OPENAI_API_KEY = "offline", ""

    golden = golden_set_create(workspace=workspace, name="judged", graders=[{"kind": "llm_judge"}])
    for question, expected, _ in ITEMS[:3]:
        golden_item_add(golden_set=golden, input={"text": question}, expected_output=expected)
    version = _looks_up(make_version)
    settings.EVAL_JUDGE_MODEL = "gpt-4.1-mini"
    first = evaluate(golden, version)
    assert first.status == "completed" and first.config["judge_model"] == "gpt-4.1-mini"
    settings.EVAL_JUDGE_MODEL = "gpt-4.1"
    second = evaluate(golden, version)
    assert second.config["judge_model"] == "gpt-4.1" and second.items_reused == 3


def test_a_failed_invocation_scores_zero_and_is_not_a_grading_error(support_set, make_version, evaluate):
    from tests.builders import graph, node

    looping = make_version(graph("a", node("a", handoffs=["b"]), node("b", handoffs=["a"])), name="loops")
    run = evaluate(support_set, looping, node_budget=2)
    assert run.status == "completed"
    results = GoldenResult.objects.filter(eval_run=run)
    assert {r.score for r in results} == {0.0} and run.grading_errors == 0
    assert all("node budget exceeded" in r.error for r in results)
    assert run.avg_score == 0 and run.pass_rate == 0


def test_an_eval_run_is_refused_when_it_cannot_run(workspace, other_workspace, support_set, make_version):
    from tests.builders import graph, node

    empty = golden_set_create(workspace=workspace, name="empty", graders=[{"kind": "exact"}])
    ok = make_version(graph("a", node("a")), name="ok")
    with pytest.raises(EvalError) as refused:
        eval_run_start(golden_set=empty, version=ok)
    assert "golden_set" in refused.value.errors
    lacking = make_version(graph("a", node("a", tools=["tavily"])), name="lacking")
    with pytest.raises(EvalError) as refused:
        eval_run_start(golden_set=support_set, version=lacking)
    assert "tools" in refused.value.errors
    foreign = make_version(graph("a", node("a")), name="foreign", workspace_=other_workspace)
    with pytest.raises(EvalError) as refused:
        eval_run_start(golden_set=support_set, version=foreign)
    assert "workflow_version" in refused.value.errors
    assert not EvalRun.objects.exists()


def test_item_and_set_validation_name_the_field(workspace):
    with pytest.raises(EvalError) as refused:
        golden_set_create(workspace=workspace, name="bad", graders=[{"kind": "nonsense"}])
    assert any("graders" in key for key in refused.value.errors)
    golden = golden_set_create(workspace=workspace, name="ok", graders=[{"kind": "exact"}])
    for kwargs, field in [({"input": None}, "input"), ({"rubric": [{"criterion": "x"}]}, "rubric"),
                          ({"tags": "critical"}, "tags"), ({"metadata": [1]}, "metadata")]:
        with pytest.raises(EvalError) as refused:
            golden_item_add(golden_set=golden, **({"input": {"text": "q"}} | kwargs))
        assert field in refused.value.errors


def test_compare_promote_and_rollback(facts, support_set, support_versions, evaluate, owner):
    from workflows.services import workflow_version_activate

    base, better = support_versions
    workflow_version_activate(version=base)
    base_run, better_run = evaluate(support_set, base), evaluate(support_set, better)
    assert better_run.avg_score > base_run.avg_score
    evidence = compare_versions(golden_set=support_set, version_a=base, version_b=better)
    comparison = evidence["comparison"]
    assert comparison["n"] == 6 and comparison["mean_diff"] > 0 and comparison["ci_low"] <= comparison["mean_diff"]
    assert comparison["verdict"] == "better" and comparison["p_value"] < 0.05, evidence
    assert [row["item"] for row in evidence["items"]] == list(support_set.items.order_by("position")
                                                            .values_list("pk", flat=True))
    with pytest.raises(EvalError, match="already the active version"):
        version_promote(candidate=base, golden_set=support_set)
    promotion = version_promote(candidate=better, golden_set=support_set, user=owner)
    better.refresh_from_db()
    base.refresh_from_db()
    assert better.status == "active" and base.status == "archived"
    assert promotion.previous_version == base and promotion.evidence["comparison"]["verdict"] == "better"
    assert promotion.decided_by == owner
    rollback = version_rollback(workflow=base.workflow, user=owner)
    base.refresh_from_db()
    better.refresh_from_db()
    assert base.status == "active" and better.status == "archived"
    assert rollback.action == Promotion.Action.ROLLBACK and rollback.previous_version == better


def test_a_candidate_that_is_not_significantly_better_is_refused(facts, support_set, support_versions, evaluate):
    from workflows.services import workflow_version_activate, workflow_version_create

    base, better = support_versions
    workflow_version_activate(version=better)
    evaluate(support_set, better)
    evaluate(support_set, base)
    with pytest.raises(PromotionRefused) as refused:
        version_promote(candidate=base, golden_set=support_set)
    assert refused.value.evidence["comparison"]["verdict"] == "worse"
    better.refresh_from_db()
    assert better.status == "active"
    # a rewording with the same behaviour: no significant difference
    same, _ = workflow_version_create(workflow=base.workflow, dsl={**better.dsl, "description": "reworded"})
    evaluate(support_set, same)
    with pytest.raises(PromotionRefused) as refused:
        version_promote(candidate=same, golden_set=support_set)
    assert refused.value.evidence["comparison"]["verdict"] == "no significant difference"
    assert WorkflowVersion.objects.get(pk=better.pk).status == "active"


def test_compare_pairs_only_results_graded_on_the_same_item_contents(facts, support_set, support_versions, evaluate):
    """Version a was evaluated, then every item's expected output was rewritten (a different
    question to pass), then version b was evaluated. A paired test over "the same items" must only
    pair results graded on the same contents: here none, so the comparison has no data (or is
    refused), never a verdict from a's answers to old items against b's answers to new ones."""
    base, better = support_versions
    evaluate(support_set, base)
    for item in support_set.items.all():
        item.expected_output = "Unrelated: " + item.expected_output[::-1]
        item.save()
    evaluate(support_set, better)
    try:
        result = compare_versions(golden_set=support_set, version_a=base, version_b=better)
    except Exception as exc:  # a refusal naming the stale run is fine
        assert "changed" in str(exc) or "stale" in str(exc)
        return
    assert result["comparison"]["n"] == 0, result["comparison"]


def test_a_minibatch_run_is_neither_the_comparison_evidence_nor_the_versions_average(facts, support_set,
                                                                                   support_versions, evaluate):
    """Reflective evolution scores candidates on minibatches (`eval_run_prepare(item_ids=...)`). Such a
    run must not overwrite the version's avg_score/pass_rate with a two-item figure, nor become the
    "latest completed run" a comparison or promotion is decided on (it would pair two items instead
    of six, and skip the critical items outside the batch)."""
    from durable.inprocess import run_until_settled
    from durable.services import run_start
    from evals.durable_workflows import EVAL_WORKFLOW

    base, better = support_versions
    evaluate(support_set, base)
    full = evaluate(support_set, better)
    better.refresh_from_db()
    full_avg = better.avg_score
    items = list(support_set.items.order_by("position").values_list("pk", flat=True))
    mini = eval_run_prepare(golden_set=support_set, version=better, item_ids=items[-2:], reuse=True)
    durable = run_start(workflow=EVAL_WORKFLOW, input={"eval_run_id": mini.pk}, run_id=f"eval-{mini.pk}",
                        namespace=support_set.workspace.namespace)
    run_until_settled(durable.pk, max_wait=60)
    mini.refresh_from_db()
    assert mini.status == "completed" and mini.items_total == 2
    result = compare_versions(golden_set=support_set, version_a=base, version_b=better)
    better.refresh_from_db()
    assert result["eval_run_b"] == full.pk and result["comparison"]["n"] == 6, result["comparison"]
    assert better.avg_score == full_avg


def test_a_critical_regression_blocks_a_promotion(support_set, support_versions, owner, monkeypatch):
    """Eight items better by 0.3 to 0.5, the critical one worse by 0.15: significant overall, still refused."""
    from evals import services
    from workflows.services import workflow_version_activate

    base, better = support_versions
    workflow_version_activate(version=base)
    items = list(support_set.items.order_by("position"))
    critical = next(i for i in items if i.critical)
    a_scores = {i.pk: 0.5 for i in items}
    b_scores = {i.pk: (0.35 if i.pk == critical.pk else 0.8) for i in items}
    extra = [golden_item_add(golden_set=support_set, input={"text": f"q{n}"}, expected_output="x") for n in range(3)]
    for item in extra:
        a_scores[item.pk], b_scores[item.pk] = 0.4, 0.9
    runs = {base.pk: EvalRun(pk=1), better.pk: EvalRun(pk=2)}
    monkeypatch.setattr("evals.selectors.latest_completed_run", lambda golden_set, version: runs[version.pk])
    monkeypatch.setattr("evals.selectors.run_scores", lambda run: a_scores if run.pk == 1 else b_scores)
    evidence = services.compare_versions(golden_set=support_set, version_a=base, version_b=better)
    assert evidence["comparison"]["verdict"] == "better"
    assert [row["item"] for row in evidence["critical_regressions"]] == [critical.pk]
    with pytest.raises(PromotionRefused, match="critical"):
        version_promote(candidate=better, golden_set=support_set, user=owner)


def test_a_critical_item_the_candidate_was_not_graded_on_blocks_a_promotion(support_set, support_versions, owner,
                                                                            monkeypatch):
    """Ten items better by 0.4 (significant), the critical item a grading error (score None) for the
    candidate where the active version scored 1.0. A promotion needs "no critical item regressed";
    a critical item with no score cannot show that, so the promotion must be refused (or the item
    reported among the critical regressions), not go through silently."""
    from evals.services import PromotionRefused, golden_item_add, version_promote
    from workflows.models import WorkflowVersion
    from workflows.services import workflow_version_activate

    base, better = support_versions
    workflow_version_activate(version=base)
    items = list(support_set.items.order_by("position"))
    items += [golden_item_add(golden_set=support_set, input={"text": f"q{n}"}, expected_output="x") for n in range(4)]
    critical = next(i for i in items if i.critical)
    a_scores = {i.pk: (1.0 if i.pk == critical.pk else 0.4) for i in items}
    b_scores = {i.pk: (None if i.pk == critical.pk else 0.8) for i in items}
    runs = {base.pk: EvalRun(pk=1), better.pk: EvalRun(pk=2)}
    monkeypatch.setattr("evals.selectors.latest_completed_run", lambda golden_set, version: runs[version.pk])
    monkeypatch.setattr("evals.selectors.run_scores", lambda run: a_scores if run.pk == 1 else b_scores)
    try:
        version_promote(candidate=better, golden_set=support_set, user=owner)
    except PromotionRefused:
        return
    assert WorkflowVersion.objects.get(pk=better.pk).status != "active", \
        "promoted with its critical item ungraded"


def test_a_failure_at_the_start_is_recorded_on_the_eval_run(support_set, support_versions, evaluate, monkeypatch):
    from durable import owners

    def broken(*args):
        raise RuntimeError("the database said no")

    monkeypatch.setattr(owners.owner_of(EvalRun), "plan", broken)
    run = evaluate(support_set, support_versions[0])
    assert run.status == "failed" and "the database said no" in run.error and run.ended_at


def test_rollback_goes_to_the_version_archived_last(make_version):
    from tests.builders import graph, node
    from workflows.services import workflow_version_activate, workflow_version_create

    first = make_version(graph("a", node("a", prompt="one")), name="rollback")
    second, _ = workflow_version_create(workflow=first.workflow, dsl=graph("a", node("a", prompt="two")))
    third, _ = workflow_version_create(workflow=first.workflow, dsl=graph("a", node("a", prompt="three")))
    for version in (second, first, third):  # first is archived last, when third takes over
        workflow_version_activate(version=version)
    assert version_rollback(workflow=first.workflow).workflow_version == first


def test_rollback_walks_back_the_activation_history_whatever_was_evaluated_since(support_set, make_version, evaluate,
                                                                                 owner):
    """v1, v2, v3 activated in turn, then v1 evaluated (which writes its scores): a rollback returns to
    v2, the next to v1, and one more has nowhere to go; a promotion after a rollback is what the next
    rollback undoes."""
    from tests.builders import graph, node
    from workflows.services import workflow_version_activate, workflow_version_create

    v1 = make_version(graph("a", node("a", prompt="one")), name="history")
    v2, _ = workflow_version_create(workflow=v1.workflow, dsl=graph("a", node("a", prompt="two")))
    v3, _ = workflow_version_create(workflow=v1.workflow, dsl=graph("a", node("a", prompt="three")))
    for version in (v1, v2, v3):
        workflow_version_activate(version=version)
    assert evaluate(support_set, v1).status == "completed"
    first = version_rollback(workflow=v1.workflow, user=owner)
    assert (first.workflow_version, first.previous_version) == (v2, v3)
    second = version_rollback(workflow=v1.workflow, user=owner)
    assert (second.workflow_version, second.previous_version) == (v1, v2)
    with pytest.raises(EvalError, match="no earlier active version"):
        version_rollback(workflow=v1.workflow)
    assert WorkflowVersion.objects.get(status="active") == v1
    workflow_version_activate(version=v3)
    assert version_rollback(workflow=v1.workflow).workflow_version == v1


def test_cancelling_an_eval_run_before_its_items_start_ends_their_invocations(support_set, support_versions):
    from durable import owners, turns
    from evals.services import eval_run_cancel

    run = eval_run_start(golden_set=support_set, version=support_versions[0], concurrency=6)
    turns.execute_turn(run.durable_run_id)  # begun: its six lanes started
    for lane in DurableRun.objects.filter(parent_id=run.durable_run_id):
        # each lane writes its first item's invocation, whose run has not begun (no worker followed it)
        turns.execute_turn(lane.id, follow=False)
    invocations = WorkflowInvocation.objects.filter(workflow_version=support_versions[0])
    assert invocations.count() == 6 and set(invocations.values_list("status", flat=True)) == {"queued"}
    assert eval_run_cancel(eval_run=run)
    assert owners.reconcile()["workflows.WorkflowInvocation"] == 6
    assert set(invocations.values_list("status", flat=True)) == {"cancelled"}
    assert all(run.durable_run_id in error for error in invocations.values_list("error", flat=True))
    assert owners.reconcile()["workflows.WorkflowInvocation"] == 0


def test_the_reconcile_reaches_an_eval_run_behind_any_number_of_active_ones(support_set, support_versions):
    from durable import owners
    from durable.services import run_cancel

    waiting = eval_run_start(golden_set=support_set, version=support_versions[0])  # queued: legitimately active
    cancelled = eval_run_start(golden_set=support_set, version=support_versions[1])
    run_cancel(run_id=cancelled.durable_run_id, reason="from the durable admin")
    assert owners.reconcile(limit=1)["evals.EvalRun"] == 1
    waiting.refresh_from_db()
    cancelled.refresh_from_db()
    assert cancelled.status == "cancelled" and waiting.status == "queued"


def test_a_failed_eval_run_retried_to_its_end_is_completed_with_its_aggregates(support_set, support_versions,
                                                                               evaluate, monkeypatch):
    from durable.inprocess import run_until_settled
    from durable.services import run_retry
    from evals import execution

    grade = execution.eval_grade_item

    def outage(*args):
        raise RuntimeError("the grader's database said no")

    monkeypatch.setattr(execution, "eval_grade_item", outage)
    run = evaluate(support_set, support_versions[0])
    assert run.status == "failed" and "said no" in run.error
    monkeypatch.setattr(execution, "eval_grade_item", grade)
    assert run_retry(run_id=run.durable_run_id)
    assert run_until_settled(run.durable_run_id, max_wait=60).status == "completed"
    run.refresh_from_db()
    assert run.status == "completed" and run.error == "" and run.items_done == 6
    assert run.avg_score is not None and run.fitness is not None and run.ended_at


def test_an_item_graded_again_after_a_crash_does_not_pay_its_judge_again(judge_server, judged_set, monkeypatch):
    import json

    from durable.inprocess import run_until_settled
    from durable.services import run_retry
    from evals import execution

    golden, version = judged_set("judged")
    progress, crashed = execution._progress, []

    def dies_once_graded(eval_run_id):  # the worker dies after the judge answered, before the result is kept
        if not crashed and GoldenResult.objects.filter(eval_run_id=eval_run_id).exists():
            crashed.append(eval_run_id)
            raise RuntimeError("the worker died")
        progress(eval_run_id)

    monkeypatch.setattr(execution, "_progress", dies_once_graded)
    judge = judge_server
    judge.chat_replies = [{"content": json.dumps({"score": 0.8, "rationale": "Names the migration."}),
                           "usage": {"prompt_tokens": 300, "completion_tokens": 40}}] * 2
    run = eval_run_start(golden_set=golden, version=version)
    run_until_settled(run.durable_run_id, max_wait=60)
    run.refresh_from_db()
    assert run.status == "failed" and "the worker died" in run.error and crashed
    assert run_retry(run_id=run.durable_run_id)
    run_until_settled(run.durable_run_id, max_wait=60)
    run.refresh_from_db()
    assert run.status == "completed", run.error
    result = GoldenResult.objects.get(eval_run=run)
    assert result.score == 0.8 and result.judge_usd > 0 and run.judge_usd == result.judge_usd
    assert len(judge.chat_payloads) == 1  # answered from its step's checkpoint the second time


def test_a_wide_eval_run_deals_its_items_to_lanes_and_replays_no_growing_history(workspace, support_versions,
                                                                                  evaluate):
    from durable.models import StepCheckpoint
    from evals.services import golden_item_add, golden_set_create

    golden = golden_set_create(workspace=workspace, name="wide", graders=[{"kind": "token_f1"}])
    for number in range(40):
        golden_item_add(golden_set=golden, input={"text": f"question {number}"}, expected_output=f"answer {number}")
    run = evaluate(golden, support_versions[0], concurrency=4)
    assert run.status == EvalRun.Status.COMPLETED, run.error
    assert run.items_done == 40 and GoldenResult.objects.filter(eval_run=run).count() == 40
    # the eval run's own history does not grow with its items: begin, its four lanes, finish
    assert StepCheckpoint.objects.filter(run_id=run.durable_run_id).count() <= 7
    lanes = DurableRun.objects.filter(parent_id=run.durable_run_id, workflow="evals.lane")
    assert lanes.count() == 4
    items_per_lane = sorted(DurableRun.objects.filter(parent__in=lanes, workflow="workflows.invoke")
                            .values_list("parent_id", flat=True))
    assert sorted(Counter(items_per_lane).values()) == [10, 10, 10, 10]


def test_a_lane_refuses_an_eval_run_it_was_not_started_for(support_set, support_versions, workspace,
                                                            other_workspace):
    from durable.inprocess import run_until_settled
    from durable.services import run_start

    run = eval_run_start(golden_set=support_set, version=support_versions[0])
    item = support_set.items.first()
    lane_input = {"eval_run_id": run.pk, "items": [item.pk], "keys": {str(item.pk): "k"}}
    lane = run_until_settled(run_start(workflow="evals.lane", input=lane_input, namespace=workspace.namespace).id,
                             max_wait=30)
    assert lane.status == "failed" and "of which this run is not a child" in lane.error
    stranger = run_until_settled(run_start(workflow="evals.lane", input=lane_input,
                                           namespace=other_workspace.namespace).id, max_wait=30)
    assert stranger.status == "failed" and "does not belong to this run's workspace" in stranger.error
    assert not WorkflowInvocation.objects.filter(workflow_version=support_versions[0]).exists()
    assert not GoldenResult.objects.filter(eval_run=run).exists()


def test_the_judge_is_asked_on_the_llm_queue_and_a_429_waits_on_a_timer(judge_server, judged_set, settings):
    import json

    from durable.inprocess import run_until_settled
    from durable.models import StepCheckpoint

    golden, version = judged_set("judged later")
    judge = judge_server
    judge.chat_replies = [
        (429, {"Content-Type": "application/json", "Retry-After": "1"}, json.dumps({"error": {"message": "slow"}})),
        {"content": json.dumps({"score": 0.8, "rationale": "Names the migration."})}]
    settings.LLM_MAX_RETRIES = 2
    run = eval_run_start(golden_set=golden, version=version)
    run_until_settled(run.durable_run_id, max_wait=60)
    run.refresh_from_db()
    assert run.status == "completed", run.error
    assert GoldenResult.objects.get(eval_run=run).score == 0.8 and len(judge.chat_payloads) == 2
    step = StepCheckpoint.objects.get(name__startswith="judge:")
    assert step.queue == "llm" and step.status == "completed"
    assert step.options["deferrals"] == {"provider": 1}  # put off once, then answered


@pytest.fixture
def grader_outage(support_set, monkeypatch):
    """The grader fails on the support set's first item until `grader_outage.end()`."""
    from evals import execution

    first = support_set.items.order_by("position", "id").first()
    grade = execution.eval_grade_item

    def outage_on_the_first_item(eval_run_id, item_id, *args):
        if item_id == first.pk:
            raise RuntimeError("the grader's database said no")
        return grade(eval_run_id, item_id, *args)

    monkeypatch.setattr(execution, "eval_grade_item", outage_on_the_first_item)
    return SimpleNamespace(end=lambda: monkeypatch.setattr(execution, "eval_grade_item", grade))


def test_a_lane_that_fails_lets_the_other_lanes_finish_and_a_retry_scores_every_item(support_set, support_versions,
                                                                                     grader_outage):
    from durable import owners, turns
    from durable.inprocess import run_until_settled
    from durable.services import run_retry

    items = list(support_set.items.order_by("position", "id"))
    run = eval_run_start(golden_set=support_set, version=support_versions[0], concurrency=2)
    turns.execute_turn(run.durable_run_id)  # two lanes: items 1, 3, 5 and 2, 4, 6
    first, second = DurableRun.objects.filter(parent_id=run.durable_run_id).order_by("parent_seq")
    turns.execute_turn(second.id)  # the second lane's first item is on its way (its run not begun yet)
    assert run_until_settled(first.id, max_wait=30).status == "failed"  # the first lane could not grade item 1
    turns.execute_turn(run.durable_run_id)  # the eval run hears of it while the second lane's item waits
    run_until_settled(run.durable_run_id, max_wait=60)
    run.refresh_from_db()
    assert run.status == "failed" and "said no" in run.error
    # the second lane's items were not cut short by the first lane's failure
    assert set(GoldenResult.objects.filter(eval_run=run).values_list("golden_item_id", flat=True)) == \
        {item.pk for item in items[1::2]}
    owners.reconcile()
    grader_outage.end()
    assert run_retry(run_id=run.durable_run_id)
    assert run_until_settled(run.durable_run_id, max_wait=60).status == "completed"
    run.refresh_from_db()
    assert run.status == "completed" and run.items_done == 6
    results = GoldenResult.objects.filter(eval_run=run).select_related("workflow_invocation")
    assert {r.workflow_invocation.status for r in results} == {"completed"}, [r.error for r in results]
    assert WorkflowInvocation.objects.filter(workflow_version=support_versions[0]).count() == 6


def test_a_lane_retried_alone_after_its_eval_run_ended_invokes_nothing(support_set, support_versions, grader_outage):
    from durable import turns
    from durable.inprocess import run_until_settled
    from durable.services import run_retry

    run = eval_run_start(golden_set=support_set, version=support_versions[0], concurrency=2)
    turns.execute_turn(run.durable_run_id)
    first, _ = DurableRun.objects.filter(parent_id=run.durable_run_id).order_by("parent_seq")
    assert run_until_settled(run.durable_run_id, max_wait=60).status == "failed"
    run.refresh_from_db()
    assert run.status == "failed"
    invocations = WorkflowInvocation.objects.filter(workflow_version=support_versions[0]).count()
    grader_outage.end()
    assert run_retry(run_id=first.id)  # an operator retries the failed lane, not its eval run
    lane = run_until_settled(first.id, max_wait=60)
    assert lane.status == "failed" and "retry the eval run" in lane.error, lane.error
    # the eval run had ended: its lane starts no item of it again
    assert WorkflowInvocation.objects.filter(workflow_version=support_versions[0]).count() == invocations
    run.refresh_from_db()
    assert run.status == "failed"


def test_an_eval_run_retried_after_its_lane_was_retried_alone_still_scores_every_item(support_set, support_versions,
                                                                                      grader_outage):
    from durable import owners, turns
    from durable.inprocess import run_until_settled
    from durable.services import run_retry

    items = list(support_set.items.order_by("position", "id"))
    run = eval_run_start(golden_set=support_set, version=support_versions[0], concurrency=2)
    turns.execute_turn(run.durable_run_id)
    first, _ = DurableRun.objects.filter(parent_id=run.durable_run_id).order_by("parent_seq")
    assert run_until_settled(run.durable_run_id, max_wait=60).status == "failed"
    grader_outage.end()
    assert run_retry(run_id=first.id)  # the failed lane alone: its eval run had ended, so it starts nothing
    run_until_settled(first.id, max_wait=60)
    owners.reconcile()
    assert run_retry(run_id=run.durable_run_id)  # then the whole eval run
    assert run_until_settled(run.durable_run_id, max_wait=60).status == "completed"
    run.refresh_from_db()
    assert run.status == "completed" and run.items_done == 6, run.error
    assert set(GoldenResult.objects.filter(eval_run=run).values_list("golden_item_id", flat=True)) == \
        {item.pk for item in items}


def test_a_judge_put_off_for_too_long_is_a_grading_error_not_a_failed_eval_run(judge_server, judged_set, settings):
    import json

    from durable.inprocess import run_until_settled

    golden, version = judged_set("judge rate limited", ("Why did the deploy fail?", "Who rolled it back?"))
    limited = (429, {"Content-Type": "application/json", "Retry-After": "30"},
               json.dumps({"error": {"message": "slow"}}))
    judge_server.chat_replies = [limited] * 4
    settings.LLM_MAX_RETRIES = 2
    settings.DURABLE_STEP_MAX_DEFER_SECONDS = 5  # waiting 30 s more would pass it: the judge's step gives up
    run = eval_run_start(golden_set=golden, version=version)
    run_until_settled(run.durable_run_id, max_wait=30)
    run.refresh_from_db()
    assert run.status == "completed", run.error
    results = GoldenResult.objects.filter(eval_run=run)
    assert results.count() == 2 and run.grading_errors == 2
    assert all(r.score is None and "put off" in r.error for r in results)


@pytest.mark.django_db(transaction=True)
def test_items_graded_at_once_by_two_lanes_are_both_counted_in_the_progress(support_set, support_versions,
                                                                              monkeypatch):
    import threading

    from django.db import connection

    from durable import owners
    from evals import execution
    from workspaces.models import Workspace

    run = eval_run_start(golden_set=support_set, version=support_versions[0], concurrency=2)
    plan = owners.begin(EvalRun, run.pk, Workspace.namespace_of(run.workspace_id), run.durable_run_id)
    first, second = plan["pending"][:2]
    invocations = execution.eval_invocations_create(run.pk, [first, second], run.durable_run_id)
    progress, both_written = execution._progress, threading.Barrier(2, timeout=30)

    def counted_once_both_results_are_written(eval_run_id):
        both_written.wait()  # each lane's result is written, neither committed yet
        progress(eval_run_id)

    monkeypatch.setattr(execution, "_progress", counted_once_both_results_are_written)
    errors = []

    def grade(item):
        try:
            execution.eval_grade_item(run.pk, item, invocations[str(item)], plan["keys"][str(item)])
        except Exception as exc:
            errors.append(exc)
        finally:
            connection.close()

    lanes = [threading.Thread(target=grade, args=(item,)) for item in (first, second)]
    for lane in lanes:
        lane.start()
    for lane in lanes:
        lane.join(60)
    assert errors == []
    run.refresh_from_db()
    assert GoldenResult.objects.filter(eval_run=run).count() == 2
    assert run.items_done == 2


def test_an_item_whose_lane_was_cancelled_before_its_run_began_is_ended_while_the_eval_run_goes_on(
        support_set, support_versions):
    from durable import owners, turns
    from durable.inprocess import run_until_settled
    from durable.services import run_cancel

    run = eval_run_start(golden_set=support_set, version=support_versions[0], concurrency=2)
    turns.execute_turn(run.durable_run_id)
    first, _other = DurableRun.objects.filter(parent_id=run.durable_run_id).order_by("parent_seq")
    turns.execute_turn(first.id, follow=False)  # its first item's invocation is written, the item's run not begun
    waiting = WorkflowInvocation.objects.get(workflow_version=support_versions[0])
    assert run_cancel(run_id=first.id, reason="from the durable admin")
    assert DurableRun.objects.get(pk=run.durable_run_id).status in DurableRun.Status.ACTIVE  # its other lane runs
    assert owners.reconcile()["workflows.WorkflowInvocation"] == 1
    waiting.refresh_from_db()
    assert waiting.status == "cancelled" and first.id in waiting.error
    run_until_settled(run.durable_run_id, max_wait=60)
    run.refresh_from_db()
    assert run.status == "failed" and "from the durable admin" in run.error
    assert GoldenResult.objects.filter(eval_run=run).count() == 3  # the other lane's items

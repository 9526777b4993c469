"""Review findings for eval runs, their statistics, reuse and comparison: each test pins the
behaviour a fix must bring and fails until then (strict xfail, so the suite stays green and a fix
that lands turns the xfail into an error that asks for the marker to go)."""

import pytest

from evals.models import EvalRun, GoldenResult
from evals.services import compare_versions, eval_run_prepare
from evals.stats import paired_comparison

pytestmark = pytest.mark.django_db


def test_a_candidate_worse_on_almost_every_item_is_never_called_better():
    """Nineteen of twenty items drop a little and one jumps: the Wilcoxon test is highly significant
    *because the ranks are overwhelmingly negative*, while the mean difference is positive (and its 95%
    bootstrap interval spans 0). The verdict must not be "better" (the direction of a significant
    result is the test's: its rank sums, or a one-sided alternative), or a promotion goes through for
    a version that is worse on 95% of the set."""
    a = [0.5] * 19 + [0.0]
    b = [0.5 - 0.001 * (i + 1) for i in range(19)] + [1.0]
    comparison = paired_comparison(a, b)
    assert comparison.p_value < 0.05 and comparison.mean_diff > 0  # the data are as described
    assert comparison.verdict != "better", comparison


def _looks_up(make_version):
    from tests.workflows.conftest import graph, node

    return make_version(graph("agent", node("agent", tools=["knowledge_search"],
                                            prompt="You are a helpful support agent. Call knowledge_search first.")),
                        name="looks-up")


def test_a_failure_caused_by_one_runs_budget_is_not_reused_by_a_run_with_another(facts, support_set, make_version,
                                                                              evaluate):
    """An eval run with node_budget=1 makes a two-node workflow fail on every item (score 0, not a
    grading error). A later run of the same version with the default budget must run the items again
    (the failure was the run's budget, not the genome's), not copy the zeros."""
    from tests.workflows.conftest import graph, node

    two_step = make_version(graph("plan", node("plan", handoffs=["answer"], prompt="Hand off to answer."),
                                  node("answer", prompt="You are a helpful support agent.")), name="two-step")
    starved = evaluate(support_set, two_step, node_budget=1)
    assert starved.status == "completed"
    assert {r.score for r in GoldenResult.objects.filter(eval_run=starved)} == {0.0}
    assert all("budget" in r.error for r in GoldenResult.objects.filter(eval_run=starved))
    normal = evaluate(support_set, two_step)
    assert normal.status == "completed"
    assert normal.items_reused == 0, "budget failures were copied into a run with another budget"


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

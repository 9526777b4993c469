"""The prompt rewriter: offline rules from grader verdicts to directives the offline model obeys,
so each rewrite genuinely scores higher; a real model through the openai client."""

import json

import pytest

from evals.rewriter import offline_proposal, propose, worst_failures
from evals.services import golden_item_add, golden_set_create
from tests.builders import graph, node
from tests.evals.conftest import ITEMS
from workflows.models import WorkflowVersion

pytestmark = pytest.mark.django_db


def test_a_rewrite_adds_the_lookup_the_failures_lacked_and_scores_higher(facts, support_set, make_version,
                                                                        evaluate, owner):
    base = make_version(graph("agent", node("agent", prompt="You are a helpful support agent.")))
    first = evaluate(support_set, base)
    assert len(worst_failures(first)) == 5  # the five worst of six failures
    proposal = propose(eval_run=first, user=owner)
    assert proposal.skipped == "" and proposal.created and proposal.confidence == 1.0
    candidate = proposal.version
    assert candidate.status == WorkflowVersion.Status.CANDIDATE and candidate.operation == "mutation"
    assert candidate.parent1 == base and candidate.created_by == owner
    (agent,) = candidate.dsl["nodes"]
    assert "knowledge_search" in agent["codeTools"]
    assert agent["systemPrompt"] == "You are a helpful support agent. Call knowledge_search before answering."
    assert "knowledge_search" in candidate.commit_message
    second = evaluate(support_set, candidate)
    assert second.avg_score > first.avg_score + 0.5
    # the same rewrite again is the same version (content-addressed), not a new one
    again = propose(eval_run=first)
    assert again.version == candidate and not again.created


def test_a_json_set_is_rewritten_to_the_fields_and_the_facts_each_step_scoring_higher(
        facts, workspace, make_version, evaluate):
    golden = golden_set_create(workspace=workspace, name="json support", graders=[{"kind": "json_fields"}])
    for question, expected, _terms in ITEMS:
        golden_item_add(golden_set=golden, input={"text": question}, expected_output=json.dumps({"answer": expected}))
    base = version = make_version(graph("agent", node("agent", prompt="You answer customers.")))
    scores = []
    for _ in range(3):
        run = evaluate(golden, version)
        scores.append(run.avg_score)
        proposal = propose(eval_run=run)
        if proposal.skipped:
            break
        version = proposal.version
    assert scores[0] == 0 and scores[-1] > 0.5
    assert scores == sorted(scores) and len(set(scores)) == len(scores)  # each kept rewrite scored higher
    prompt = version.dsl["nodes"][0]["systemPrompt"]
    # the answers lacked both the fields and the facts: the first rewrite asks for both
    assert prompt == ("You answer customers. Answer in JSON with the field answer. "
                      "Call knowledge_search before answering.")
    assert version.parent1 == base


def test_nothing_to_fix_and_nothing_explained_are_skipped(facts, support_set, support_versions, evaluate,
                                                          workspace):
    _, better = support_versions
    good = evaluate(support_set, better)
    assert good.pass_rate == 1.0  # every item passes: nothing to learn from
    assert propose(eval_run=good).skipped == "no failing item to learn from"
    golden = golden_set_create(workspace=workspace, name="regex", graders=[{"kind": "regex", "pattern": "^zzz$"}])
    golden_item_add(golden_set=golden, input={"text": "anything"}, expected_output="Zzz here. And yyy there.")
    run = evaluate(golden, better)
    proposal = propose(eval_run=run)
    assert proposal.skipped == "no rule explains the failures" and proposal.version is None
    assert WorkflowVersion.objects.filter(parent1=better).count() == 0


def test_a_directive_already_in_the_prompt_is_not_added_again(facts, support_set, support_versions, evaluate):
    base, better = support_versions
    failures = worst_failures(evaluate(support_set, base))
    assert offline_proposal(base, "agent", failures).changelog[0].startswith("look the facts up")
    # the same failures, read against a prompt that already looks things up: nothing to add
    assert offline_proposal(better, "agent", failures).skipped == "no rule explains the failures"


def test_a_real_model_rewrites_through_the_openai_client(facts, support_set, support_versions, evaluate, settings):
    from tests.openai_server import FakeOpenAIChat

    base, _ = support_versions
    run = evaluate(support_set, base)  # offline
    with FakeOpenAIChat() as server:
        settings.LLM_PROVIDER, settings.OPENAI_API_KEY = "openai", "sk-test"
        settings.OPENAI_BASE_URL, settings.LLM_MAX_RETRIES = server.url("/v1"), 0
        server.chat_replies = [{"content": json.dumps({
            "failure_analysis": "the agent never looks anything up", "changelog": ["search before answering"],
            "improved_prompt": "You are a helpful support agent. Search the knowledge base first.",
            "confidence": 0.8})}, {"content": json.dumps({"improved_prompt": "x", "confidence": 0.1})}]
        proposal = propose(eval_run=run)
        low = propose(eval_run=run)
    assert proposal.rewriter == "gpt-4.1-mini" and proposal.created
    assert proposal.version.dsl["nodes"][0]["systemPrompt"] == \
        "You are a helpful support agent. Search the knowledge base first."
    request = server.chat_payloads[0]
    assert request["temperature"] == 0.3
    sent = json.loads(request["messages"][1]["content"])
    assert len(sent["failures"]) == 5 and all(len(f["expected"]) <= 500 for f in sent["failures"])
    assert low.skipped.startswith("confidence 0.10 is below 0.3") and low.version is None


def test_the_rewriter_model_setting_names_who_rewrites(facts, support_set, support_versions, evaluate, settings):
    """EVAL_REWRITER_MODEL: a real model rewrites the prompts of a node whose own model is another."""
    from tests.openai_server import FakeOpenAIChat

    base, _ = support_versions
    run = evaluate(support_set, base)  # offline
    with FakeOpenAIChat() as server:
        settings.LLM_PROVIDER, settings.OPENAI_API_KEY = "openai", "sk-test"
        settings.OPENAI_BASE_URL, settings.LLM_MAX_RETRIES = server.url("/v1"), 0
        settings.EVAL_REWRITER_MODEL = "gpt-4.1"
        server.chat_replies = [{"content": json.dumps({
            "failure_analysis": "no lookup", "changelog": ["search first"],
            "improved_prompt": "Search the knowledge base first, then answer.", "confidence": 0.9})}]
        proposal = propose(eval_run=run)
    assert proposal.rewriter == "gpt-4.1" and server.chat_payloads[0]["model"] == "gpt-4.1"

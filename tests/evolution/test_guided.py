"""Offspring a real model writes (evolution/guided.py): prompts merged given each parent's wins, immigrants
written from the goal; through the real openai client against the local OpenAI-compatible server. Offline,
the structural operators make them."""

import json
import random

import pytest

from evolution import execution, guided
from tests.builders import graph, node
from workflows.dsl import parse

pytestmark = pytest.mark.django_db

MOTHER = parse(graph("agent", node("agent", prompt="You are a support agent. Answer in one sentence.")))
FATHER = parse(graph("agent", node("agent", prompt="You are a support agent. Call knowledge_search first.")))
MERGED = "You are a support agent. Call knowledge_search first. Answer in one sentence."


@pytest.fixture
def online(settings, openai_server):
    settings.LLM_PROVIDER, settings.OPENAI_API_KEY = "openai", "sk-test"
    settings.OPENAI_BASE_URL = openai_server.url("/v1")
    settings.EVAL_REWRITER_MODEL = ""
    return openai_server


def _answer(prompts: dict, rationale="keeps both") -> dict:
    return {"content": json.dumps({"prompts": prompts, "rationale": rationale})}


def test_offline_no_model_guides_and_the_structural_operators_stay(settings, make_version):
    settings.LLM_PROVIDER = "offline"
    assert guided.guide_model(MOTHER) is None
    mother, father = make_version(MOTHER), make_version(FATHER)
    child = execution._crossover(mother, None, father, None, random.Random(1))
    assert child is not None and child.kind == "crossover"


def test_a_guided_crossover_merges_the_differing_prompts_given_each_parents_wins(online):
    assert guided.guide_model(MOTHER) == "gpt-4.1-mini"
    online.chat_replies = [_answer({"agent": MERGED, "ghost": "ignored"})]
    child = guided.merged_crossover(MOTHER, FATHER, {"a": ["How long do refunds take?"], "b": ["When do orders ship?"]},
                                    "gpt-4.1-mini")
    assert child.operation == "crossover" and child.kind == "guided_crossover"
    assert child.dsl["nodes"][0]["systemPrompt"] == MERGED and "merged by gpt-4.1-mini: keeps both" in child.note
    (request,) = online.chat_payloads
    asked = json.loads(request["messages"][1]["content"])
    assert asked["nodes"][0]["prompt_a"] == MOTHER["nodes"][0]["systemPrompt"]
    assert asked["nodes"][0]["prompt_b"] == FATHER["nodes"][0]["systemPrompt"]
    assert asked["items_a_wins"] == ["How long do refunds take?"] and asked["items_b_wins"] == ["When do orders ship?"]
    assert request["response_format"] == {"type": "json_object"}


@pytest.mark.parametrize("reply", [
    {"content": "not json"},
    {"content": json.dumps({"prompts": "agent"})},
    {"content": json.dumps({"prompts": {"agent": "   "}})},
    _answer({"agent": "You are a support agent. Answer in one sentence."}),  # the mother again
    (400, {"Content-Type": "application/json"}, '{"error": {"message": "bad model"}}'),
])
def test_an_unusable_merge_gives_nothing_and_the_structural_crossover_is_used(online, reply):
    online.chat_replies = [reply]
    assert guided.merged_crossover(MOTHER, FATHER, {}, "gpt-4.1-mini") is None


def test_parents_with_the_same_prompts_ask_no_model(online):
    assert guided.merged_crossover(MOTHER, MOTHER, {}, "gpt-4.1-mini") is None
    assert online.chat_payloads == []


def test_a_guided_immigrant_writes_every_prompt_from_the_goal(online):
    online.chat_replies = [_answer({"agent": "Answer billing questions from the knowledge base."}, "the goal")]
    child = guided.written_immigrant(MOTHER, "Answer billing questions well.", "gpt-4.1-mini")
    assert child.operation == "immigrant" and child.kind == "guided_immigrant"
    assert child.dsl["nodes"][0]["systemPrompt"] == "Answer billing questions from the knowledge base."
    assert json.loads(online.chat_payloads[0]["messages"][1]["content"])["goal"] == "Answer billing questions well."
    assert guided.written_immigrant(MOTHER, "  ", "gpt-4.1-mini") is None and len(online.chat_payloads) == 1


def test_a_reflect_merge_with_a_real_model_is_recorded_as_guided_with_its_cost(facts, support_set, make_version,
                                                                               evolve, settings, openai_server):
    from decimal import Decimal

    from evals.models import EvalRun
    from llm.prices import cost_usd

    mother = make_version(graph("agent", node("agent", prompt="You are a helpful support agent.")), name="support")
    run = evolve(mother.workflow, support_set, mode="reflective", config={"population": 2, "generations": 1,
                                                                           "seed": 1, "minibatch": 2})
    from workflows.services import workflow_version_create

    father_dsl = graph("agent", node("agent", prompt="You are a support agent. Call knowledge_search before "
                                                    "answering.", tools=["knowledge_search"]))
    father, _ = workflow_version_create(workflow=mother.workflow, parents=(mother,), dsl=father_dsl)
    evals = {mother: EvalRun.objects.filter(workflow_version=mother).order_by("pk").first()}
    settings.LLM_PROVIDER, settings.OPENAI_API_KEY = "openai", "sk-test"
    settings.OPENAI_BASE_URL = openai_server.url("/v1")
    openai_server.chat_replies = [{**_answer({"agent": MERGED}), "usage": {"prompt_tokens": 800,
                                                                          "completion_tokens": 100}}]
    reflected = execution.reflect(run.pk, 7, {"version_id": mother.pk, "eval_run": evals[mother].pk},
                                  {"version_id": father.pk, "eval_run": None}, [mother.pk, father.pk])
    assert reflected["child"]["kind"] == "guided_crossover" and reflected["child"]["parents"] == [mother.pk, father.pk]
    assert Decimal(reflected["usd"]) == cost_usd("gpt-4.1-mini", provider="openai", input_tokens=800,
                                                 output_tokens=100)


@pytest.fixture
def queued_step():
    """Code running as the claimed attempt of a queued step (a guided breed on the llm queue's worker)."""
    import tests.durable.workflows  # noqa: F401 - registers tests.heartbeat
    from durable import store, turns
    from durable.models import StepCheckpoint
    from durable.services import run_start
    from durable.steps import _current_step, _StepScope

    run = run_start(workflow="tests.heartbeat", input={"seconds": 0.1, "timeout": 90})
    turns.execute_turn(run.id)
    (claimed,) = store.steps_claim(run.id, [0], 90.0)
    StepCheckpoint.objects.filter(pk=claimed[0]).update(timeout_at=None)
    token = _current_step.set(_StepScope(claimed[0], claimed[5], 90.0))
    yield StepCheckpoint.objects.filter(pk=claimed[0])
    _current_step.reset(token)


def test_each_guided_model_call_of_a_queued_step_heartbeats_first(online, queued_step):
    """A breed asks the model once per offspring, in one step whose silence allowance is one call's: each call
    re-arms the step's clock, and a step handed to another worker meanwhile asks (and pays for) nothing more."""
    from durable.errors import StepAbandoned
    from durable.steps import _current_step

    online.chat_replies = [_answer({"agent": "Answer billing questions from the knowledge base."}, "the goal")]
    assert guided.written_immigrant(MOTHER, "Answer billing questions well.", "gpt-4.1-mini") is not None
    assert queued_step.get().timeout_at is not None  # re-armed as the call began
    queued_step.update(status="pending")  # its clock ran out: another worker has it now
    _current_step.get().last_persist = 0.0  # and the next heartbeat is due (heartbeats persist every few seconds)
    with pytest.raises(StepAbandoned):
        guided.merged_crossover(MOTHER, FATHER, {}, "gpt-4.1-mini")
    assert len(online.chat_payloads) == 1

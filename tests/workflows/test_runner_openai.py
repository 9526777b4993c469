"""The runner with the OpenAI provider: the real `openai` client over HTTP to a local
OpenAI-compatible server (tests/openai_server.py), in-process and on real Celery workers."""

import json
import os
import signal
import threading
import time
import uuid
from collections import Counter
from decimal import Decimal

import pytest
from django.db import connection as db_connection
from django.urls import reverse

from config.supervisor import stop_process_groups
from durable import tick
from durable.inprocess import run_until_settled
from durable.models import DurableRun, StepCheckpoint
from llm.prices import cost_usd
from tests.builders import graph, node
from tests.openai_server import FakeOpenAIChat, peak_overlap
from tests.workflows.invocations import die_after, drive_through_crashes, nodes_of
from tests.workflows.workers import (
    drive_until_ended,
    kill_mid_call_and_finish,
    split_workers,
    split_workers_running,
    worker,
)
from workflows import execution
from workflows.models import ContextEntry, Message, NodeInvocation
from workflows.services import invocation_start


@pytest.fixture
def chat_server(settings):
    with FakeOpenAIChat() as server:
        settings.LLM_PROVIDER = "openai"
        settings.OPENAI_API_KEY = "sk-test"
        settings.OPENAI_BASE_URL = server.url("/v1")
        settings.LLM_MAX_RETRIES = 0
        yield server


@pytest.fixture
def skills(workspace):
    from tests.factories import SkillFactory

    return [SkillFactory(workspace=workspace, name=name, description=f"The {name} skill.",
                         content_md=f"Body of the {name} skill. " * 20, triggers=[])
            for name in ("alpha", "beta")]


@pytest.mark.django_db
def test_a_node_calls_a_tool_through_the_openai_client_and_answers_from_its_result(
        chat_server, make_version, invoke, workspace):
    from durable.inprocess import run_until_settled
    from knowledge.services import source_create_text

    source, _ = source_create_text(workspace=workspace, title="Billing handbook",
                                   text="Refunds take five business days. Invoices are sent monthly.")
    run_until_settled(source.ingest_run_id, max_wait=30)
    chat_server.chat_replies = [
        {"tool_calls": [("call_1", "knowledge_search", {"query": "refund delay"})],
         "usage": {"prompt_tokens": 120, "completion_tokens": 20}},
        {"content": "Refunds take five business days.", "usage": {"prompt_tokens": 300, "completion_tokens": 8}},
    ]
    version = make_version(graph("a", node("a", prompt="Answer billing questions.", tools=["knowledge_search"])))
    invocation = invoke(version, {"text": "How long is a refund?"})
    assert invocation.status == "completed", invocation.error
    assert invocation.output["text"] == "Refunds take five business days."
    first, second = chat_server.chat_payloads
    assert first["model"] == "gpt-4.1-mini" and first["tools"][0]["function"]["name"] == "knowledge_search"
    assert first["messages"][0] == {"role": "system", "content": "Answer billing questions."}
    tool_message = second["messages"][-1]
    assert tool_message["role"] == "tool" and tool_message["tool_call_id"] == "call_1"
    assert json.loads(tool_message["content"])["hits"][0]["title"] == "Billing handbook"
    (ran,) = NodeInvocation.objects.filter(workflow_invocation=invocation)
    assert (ran.input_tokens, ran.output_tokens, ran.llm_calls, ran.tool_calls) == (420, 28, 2, 1)
    expected = cost_usd("gpt-4.1-mini", provider="openai", input_tokens=120, output_tokens=20) + cost_usd(
        "gpt-4.1-mini", provider="openai", input_tokens=300, output_tokens=8)
    assert ran.usd_cost == invocation.usd_cost == expected > Decimal(0)
    roles = list(Message.objects.filter(node_invocation=ran).order_by("seq").values_list("role", flat=True))
    assert roles == ["data", "system", "user", "assistant", "tool", "assistant", "result"]


@pytest.mark.usefixtures("in_process")
@pytest.mark.django_db
def test_tool_call_ids_reused_across_rounds_keep_their_own_large_outputs(
        chat_server, make_version, invoke, skills, settings):
    """Several OpenAI-compatible servers (Ollama, some vLLM builds) number tool call ids per answer
    (`call_0` in every round). Each call's large output must be stored and shown for that call: the
    second round's `call_0` reads the beta skill, not the alpha skill stored by the first round."""
    settings.WORKFLOW_CONTEXT_INLINE_CHARS = 50
    chat_server.chat_replies = [
        {"tool_calls": [("call_0", "skill_load", {"name": "alpha"})]},
        {"tool_calls": [("call_0", "skill_load", {"name": "beta"})]},
        {"content": "done"},
    ]
    version = make_version(graph("a", node("a", prompt="Load the skills you need.", tools=["skill_load"])))
    invocation = invoke(version, {"text": "x"})
    assert invocation.status == "completed", invocation.error
    tool_messages = list(Message.objects.filter(workflow_invocation=invocation, role="tool").order_by("seq"))
    assert len(tool_messages) == 2
    assert "alpha" in tool_messages[0].payload["content"]
    assert "beta" in tool_messages[1].payload["content"], tool_messages[1].payload["content"][:200]
    assert ContextEntry.objects.filter(workflow_invocation=invocation).count() == 2
    third_request = chat_server.chat_payloads[2]["messages"]
    assert "Body of the beta skill" in third_request[-1]["content"]


@pytest.mark.usefixtures("in_process")
@pytest.mark.django_db
def test_a_tool_call_id_with_path_characters_does_not_fail_the_invocation(
        chat_server, make_version, invoke, skills, settings):
    """A model's tool call id is an opaque string. One such as `../../x` must not become part of a
    storage path (it raises SuspiciousFileOperation and fails the whole invocation); the large
    output is stored and the node answers."""
    settings.WORKFLOW_CONTEXT_INLINE_CHARS = 50
    chat_server.chat_replies = [{"tool_calls": [("../../x", "skill_load", {"name": "alpha"})]}, {"content": "done"}]
    version = make_version(graph("a", node("a", prompt="Load the skills you need.", tools=["skill_load"])))
    invocation = invoke(version, {"text": "x"})
    assert invocation.status == "completed", invocation.error
    assert ContextEntry.objects.filter(workflow_invocation=invocation).count() == 1


@pytest.mark.usefixtures("in_process")
@pytest.mark.django_db
def test_an_answer_with_more_tool_calls_than_a_node_can_record_runs_none_of_them(
        chat_server, make_version, invoke, skills, monkeypatch):
    """A node invocation holds at most MESSAGES_PER_NODE messages (10,000). A model that answers with
    more tool calls than can be recorded (a loop, a hostile or broken model) must not have them
    executed one by one (each an MCP call with the user's secrets, paid outside work) only to fail
    at the limit: the answer is refused before any call runs. The limit is lowered here to keep
    the test small; the runner's arithmetic is the same at 10,000."""
    monkeypatch.setattr(execution, "MESSAGES_PER_NODE", 40)
    ran = []
    real = execution.tool_run

    def counting(binding, arguments, **kwargs):
        ran.append(arguments)
        return real(binding, arguments, **kwargs)

    monkeypatch.setattr(execution, "tool_run", counting)
    chat_server.chat_replies = [{"tool_calls": [(f"call_{i}", "skill_load", {"name": "alpha"}) for i in range(60)]}]
    version = make_version(graph("a", node("a", prompt="Load the skills you need.", tools=["skill_load"])))
    invocation = invoke(version, {"text": "x"})
    assert invocation.status == "failed"
    assert ran == [], f"{len(ran)} tool calls ran before the node failed with: {invocation.error}"


@pytest.mark.django_db
def test_a_routing_choice_outside_the_hand_offs_fails_the_node_with_that_error(chat_server, make_version, invoke):
    chat_server.chat_replies = [{"content": "triaged"}, {"content": json.dumps({"next": "nowhere", "reason": "?"})}]
    version = make_version(graph("router", node("router", handoffs=["a", "b"], kind="conditional"), node("a"),
                                 node("b")))
    invocation = invoke(version, {"text": "route me"})
    assert invocation.status == "failed"
    (router,) = NodeInvocation.objects.filter(workflow_invocation=invocation)
    assert router.status == "failed" and "'nowhere'" in router.error and "a, b" in router.error
    assert chat_server.chat_payloads[1]["response_format"]["json_schema"]["schema"]["properties"]["next"]["enum"] \
        == ["a", "b"]


@pytest.mark.django_db
def test_a_provider_error_is_recorded_on_the_node_and_the_invocation(chat_server, make_version, invoke):
    chat_server.chat_replies = [(400, {"Content-Type": "application/json"},
                                 json.dumps({"error": {"message": "model gpt-4.1-mini does not exist"}}))]
    version = make_version(graph("a", node("a")))
    invocation = invoke(version, {"text": "x"})
    assert invocation.status == "failed" and "does not exist" in invocation.error
    (ran,) = NodeInvocation.objects.filter(workflow_invocation=invocation)
    assert ran.status == "failed" and "does not exist" in ran.error


@pytest.mark.usefixtures("in_process")
@pytest.mark.django_db
def test_retrying_the_run_of_a_failed_invocation_keeps_run_and_invocation_in_step(chat_server, make_version):
    """The durable API and admin offer `retry` (without new input) on any failed run, so on an
    invocation's run too. Either the retry is refused for a run whose invocation has ended, or the
    invocation follows its run: never a completed run under a failed invocation whose nodes
    say completed."""
    from durable.services import run_retry

    chat_server.chat_replies = [(500, {"Content-Type": "application/json"},
                                 json.dumps({"error": {"message": "upstream hiccup"}}))]
    version = make_version(graph("a", node("a")))
    invocation = invocation_start(version=version, input={"text": "x"})
    run_until_settled(invocation.durable_run_id, max_wait=30)
    invocation.refresh_from_db()
    assert invocation.status == "failed" and "upstream hiccup" in invocation.error

    run_retry(run_id=invocation.durable_run_id)
    run_until_settled(invocation.durable_run_id, max_wait=30)
    invocation.refresh_from_db()
    run = DurableRun.objects.get(pk=invocation.durable_run_id)
    assert run.status == invocation.status, (run.status, invocation.status, [n.status for n in nodes_of(invocation)])


@pytest.mark.usefixtures("in_process")
@pytest.mark.parametrize("garbage", ["\u0000", "\ud800"], ids=["nul", "lone-surrogate"])
@pytest.mark.django_db(transaction=True)
def test_a_model_answer_with_characters_postgres_refuses_does_not_fail_the_invocation(
        chat_server, make_version, invoke, garbage):
    """Models do emit U+0000 and unpaired surrogates (echoing binary tool output, broken decoding).
    Postgres text and jsonb cannot store either, so the runner must drop or replace them before
    writing the transcript, the cache and the node's output: the invocation completes with the rest
    of the answer (the call was paid; failing the invocation on it throws the answer away)."""
    chat_server.chat_replies = [{"content": f"Paris{garbage} is the capital."}]
    version = make_version(graph("a", node("a", prompt="Answer.")))
    invocation = invoke(version, {"text": "capital of France?"})
    assert invocation.status == "completed", invocation.error
    assert "Paris" in invocation.output["text"] and garbage not in invocation.output["text"]


@pytest.mark.django_db
def test_a_usd_budget_binds_on_queued_model_calls(chat_server, make_version, invoke):
    """Model calls to a real provider are queued steps; the budget checked around each still binds:
    the first call overspends, the invocation fails and the second node's call is never made."""
    chat_server.chat_replies = [{"content": "a long answer", "usage": {"prompt_tokens": 5_000,
                                                                       "completion_tokens": 2_000}}]
    version = make_version(_sequential("First node.", "Second node."))
    invocation = invoke(version, {"text": "expensive"}, usd_budget="0.0001")
    assert invocation.status == "failed" and invocation.error.startswith("USD budget exceeded")
    assert len(chat_server.chat_payloads) == 1
    (call,) = StepCheckpoint.objects.filter(run_id=invocation.durable_run_id, name__contains=":llm:")
    assert call.queue == "llm"


@pytest.mark.usefixtures("in_process")
@pytest.mark.django_db
def test_a_parallel_fan_cannot_spend_a_multiple_of_the_usd_budget(chat_server, make_version, invoke, settings):
    """$1 a model call, a $10 budget. The split node spends $1; four branches then each start with
    $9 left and make their five calls ($5 each), all under the limit as each sees it: the invocation
    spends $21 before the join notices. However a fix shares the remainder (split it between the
    branches, or check a shared total), the invocation may overshoot its budget by at most one call
    per branch, never by a multiple of it."""
    settings.LLM_PRICES = {"gpt-4.1-mini": {"input": 1_000_000, "output": 0}}
    settings.LLM_CACHE_ENABLED = False
    chat_server.chat_replies = [{"tool_calls": [("c", "nope", {})],
                                 "usage": {"prompt_tokens": 1, "completion_tokens": 0}}] * 40
    branches = [f"b{i}" for i in range(4)]
    version = make_version(graph(
        "split", node("split", handoffs=branches, kind="parallel", max_steps=1),
        *[node(name, prompt=f"Branch {name}.", tools=["skill_load"], max_steps=5) for name in branches]))
    invocation = invoke(version, {"text": "a question"}, usd_budget="10")
    assert invocation.status == "failed" and "USD budget exceeded" in invocation.error
    assert invocation.usd_cost <= Decimal(10) + len(branches), invocation.usd_cost


@pytest.mark.django_db(transaction=True)
def test_a_cancelled_invocation_makes_no_new_model_call(chat_server, make_version):
    """The invocation is cancelled while its first call is at the provider: that answer is not used
    and no further call is made."""
    from durable.inprocess import run_until_settled
    from workflows.models import WorkflowInvocation
    from workflows.services import invocation_cancel

    original = chat_server.routes["/v1/chat/completions"]

    def cancel_during_the_call(handler, body):
        try:
            invocation_cancel(invocation=WorkflowInvocation.objects.get(pk=invocation.pk), reason="stop")
        finally:
            db_connection.close()  # the server thread's own connection
        return original(handler, body)

    chat_server.routes["/v1/chat/completions"] = cancel_during_the_call
    invocation = invocation_start(version=make_version(_sequential("First node.", "Second node.")),
                                  input={"text": "x"})
    run_until_settled(invocation.durable_run_id, max_wait=10)
    invocation.refresh_from_db()
    assert invocation.status == "cancelled"
    assert [body["messages"][0]["content"] for body in chat_server.chat_payloads] == ["First node."]


@pytest.mark.usefixtures("in_process")
@pytest.mark.django_db
def test_after_a_crash_the_recorded_answer_is_the_answer_the_node_used(
        chat_server, make_version, settings, monkeypatch):
    """A model call whose worker died before its checkpoint is made again and may answer
    differently. The assistant message the invocation shows must be the answer the node went on
    with (ideally the recorded one is reused, which also avoids paying twice)."""
    settings.LLM_CACHE_ENABLED = False
    chat_server.chat_replies = [{"content": "first answer"}, {"content": "second answer"}]
    version = make_version(graph("a", node("a", prompt="Answer.")))
    die_after(monkeypatch, "llm_call")
    invocation = drive_through_crashes(invocation_start(version=version, input={"text": "which answer?"}))
    assert invocation.status == "completed", invocation.error
    (ran,) = nodes_of(invocation)
    shown = Message.objects.get(node_invocation=ran, role="assistant").payload["content"]
    assert shown == ran.output == invocation.output["text"]


@pytest.mark.usefixtures("in_process")
@pytest.mark.django_db
def test_a_tool_call_recorded_before_a_crash_is_not_run_again(chat_server, make_version, skills, monkeypatch):
    """The worker dies after a tool call ran and its result message was written, before the step's
    checkpoint. The transcript already holds the result at that message seq; the redo must answer
    from it rather than run the tool again (an MCP tool that files a ticket or sends a mail would
    do it twice), and the node must read the result the transcript shows."""
    ran = []
    real = execution.tool_run

    def counting(binding, arguments, **kwargs):
        ran.append(arguments)
        return real(binding, arguments, **kwargs)

    monkeypatch.setattr(execution, "tool_run", counting)
    die_after(monkeypatch, "tool_call")
    chat_server.chat_replies = [{"tool_calls": [("call_1", "skill_load", {"name": "alpha"})]}, {"content": "done"}]
    version = make_version(graph("a", node("a", prompt="Load the skills you need.", tools=["skill_load"])))
    invocation = drive_through_crashes(invocation_start(version=version, input={"text": "x"}))
    assert invocation.status == "completed", invocation.error
    assert len(ran) == 1, f"the tool ran {len(ran)} times"


# ------------------------------------------------------------------------------ a worker killed mid-call

@pytest.mark.worker
@pytest.mark.django_db(transaction=True)
def test_a_worker_killed_mid_invocation_resumes_without_repeating_a_completed_model_call(
        make_version, settings, tmp_path):
    """Three nodes, one model call each. The server holds the third call open; the worker making it is
    SIGKILLed; a second worker resumes the invocation. The two completed calls reach the server once
    each; only the call that never completed is made again."""
    settings.DURABLE_LEASE_SECONDS = 2
    settings.DURABLE_STEP_DEFAULT_TIMEOUT = 3
    third_call_started = threading.Event()
    hold, release = threading.Event(), threading.Event()

    with FakeOpenAIChat() as server:
        original = server.routes["/v1/chat/completions"]
        received = []  # system prompts, counted as each request arrives

        def slow_third_node(handler, body):
            received.append(json.loads(body)["messages"][0]["content"])
            if b"Node three." in body and not hold.is_set():
                hold.set()
                third_call_started.set()
                release.wait(30)  # the worker is killed while it waits for this answer
            return original(handler, body)

        server.routes["/v1/chat/completions"] = slow_third_node
        version = make_version(graph("one", node("one", prompt="Node one.", handoffs=["two"]),
                                     node("two", prompt="Node two.", handoffs=["three"]),
                                     node("three", prompt="Node three.", handoffs=["end"])))
        settings.LLM_PROVIDER, settings.OPENAI_API_KEY = "openai", "sk-test"
        settings.OPENAI_BASE_URL = server.url("/v1")
        invocation = invocation_start(version=version, input={"text": "go"})
        kill_mid_call_and_finish(invocation, base_url=server.url("/v1"), in_flight=third_call_started,
                                 release=release)
        assert invocation.status == "completed", invocation.error
        assert received.count("Node one.") == 1 and received.count("Node two.") == 1
        assert received.count("Node three.") == 2  # the call in flight when the worker died, then its redo
        calls = StepCheckpoint.objects.filter(run_id=invocation.durable_run_id, name__contains=":llm:")
        assert calls.count() == 3 and set(calls.values_list("status", flat=True)) == {"completed"}
        assert NodeInvocation.objects.filter(workflow_invocation=invocation).count() == 3


@pytest.mark.django_db
def test_a_usd_budget_on_a_model_with_no_price_is_refused_at_start(chat_server, settings, make_version):
    """A local model no price database knows would cost 0 and the budget would never bind: refused,
    naming the model and the setting, before anything is written or paid; priced by LLM_PRICES, it runs."""
    from workflows.models import WorkflowInvocation
    from workflows.services import InvocationRefused

    settings.LLM_PROVIDERS = {"local": {"base_url": chat_server.url("/v1")}}
    version = make_version(graph("a", node("a", model="local#qwen2.5:14b")))
    with pytest.raises(InvocationRefused) as refused:
        invocation_start(version=version, input={"text": "x"}, usd_budget="0.50")
    (problem,) = refused.value.errors["models"]
    assert "a.local#qwen2.5:14b" in problem and "no price is known for local model 'qwen2.5:14b'" in problem
    assert "LLM_PRICES" in problem
    assert not WorkflowInvocation.objects.exists() and chat_server.chat_payloads == []
    settings.LLM_PRICES = {"local#*": {"input": 0, "output": 0}}
    assert invocation_start(version=version, input={"text": "x"}, usd_budget="0.50").pk


@pytest.mark.django_db
def test_a_priced_model_of_a_router_runs_and_costs_the_databases_price(chat_server, settings, make_version, invoke,
                                                                        monkeypatch):
    settings.LLM_PROVIDERS = {"openrouter": {"base_url": chat_server.url("/v1"), "api_key_env": "OPENROUTER_KEY"}}
    monkeypatch.setenv("OPENROUTER_KEY", "sk-router")
    chat_server.chat_replies = [{"content": "done", "usage": {"prompt_tokens": 1_000_000, "completion_tokens": 0}}]
    invocation = invoke(make_version(graph("a", node("a", model="openrouter#openai/gpt-4.1-mini"))), {"text": "x"})
    assert invocation.status == "completed", invocation.error
    assert invocation.usd_cost == Decimal("0.40")  # OpenRouter's price of gpt-4.1-mini, from genai-prices


OUTPUT_SCHEMA = {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"],
                 "additionalProperties": False}


@pytest.mark.django_db
@pytest.mark.parametrize("structured", [True, False])
def test_the_output_schema_is_sent_as_a_response_format_where_the_provider_supports_it(
        chat_server, settings, make_version, invoke, structured):
    settings.LLM_PROVIDERS = {"local": {"base_url": chat_server.url("/v1"), "structured_outputs": structured}}
    settings.LLM_PRICES = {"local#*": {"input": 0, "output": 0}}
    chat_server.chat_replies = [{"content": "routed"}, {"content": '{"answer": "five days"}'}]
    dsl = {**graph("triage", node("triage", model="local#qwen2.5:14b", handoffs=["answer"]),
                   node("answer", model="local#qwen2.5:14b", handoffs=["end"])), "outputSchema": OUTPUT_SCHEMA}
    invocation = invoke(make_version(dsl), {"text": "How long is a refund?"})
    assert invocation.status == "completed", invocation.error
    assert invocation.output["json"] == {"answer": "five days"}
    triage, answer = chat_server.chat_payloads
    assert "response_format" not in triage  # its answer goes to another node, not to the caller
    if structured:
        assert answer["response_format"] == {"type": "json_schema", "json_schema": {
            "name": "output", "schema": OUTPUT_SCHEMA, "strict": True}}
    else:
        assert "response_format" not in answer  # asked for in the prompt, as the workflow's author wrote it


# -------------------------------------------------------------------- model calls off the turn workers

class TurnDied(BaseException):
    """The worker died in the middle of a turn (a BaseException: no workflow code sees it)."""


@pytest.mark.django_db
def test_a_turn_dying_before_its_end_commits_leaves_none_of_its_writes_and_asks_no_call_twice(
        chat_server, make_version, settings, monkeypatch):
    """The turn after a model call's answer writes the node's end, the next node's start and that node's call,
    then suspends, in one commit. A worker that dies before it leaves none of them (not a node ended with no
    successor started); the next turn writes them once and no call is asked again."""
    from datetime import timedelta

    from django.utils import timezone

    from durable import steps, store, turns
    from durable.inprocess import _step_work, run_until_settled
    from durable.models import DurableRun

    settings.DURABLE_DISPATCH_ENABLED = False
    chat_server.chat_replies = [{"content": "one"}, {"content": "two"}]
    invocation = invocation_start(version=make_version(_sequential("First node.", "Second node.")),
                                  input={"text": "die mid-turn"})
    run_id = invocation.durable_run_id
    turns.execute_turn(run_id)  # the first node starts and its call is queued
    for run, seqs in _step_work([run_id]).items():
        steps.execute_steps(run, seqs)  # answered
    release = store.run_release

    def release_then_die(*args, **kwargs):
        release(*args, **kwargs)
        raise TurnDied()

    monkeypatch.setattr(store, "run_release", release_then_die)
    with pytest.raises(TurnDied):
        turns.execute_turn(run_id)
    monkeypatch.setattr(store, "run_release", release)
    nodes = NodeInvocation.objects.filter(workflow_invocation=invocation).order_by("seq")
    assert [(row.seq, row.status) for row in nodes] == [(1, "running")]
    assert not StepCheckpoint.objects.filter(run_id=run_id, name__startswith="node:2").exists()
    assert DurableRun.objects.get(pk=run_id).status == "running"  # the dead turn's lease, until it expires

    DurableRun.objects.filter(pk=run_id).update(locked_until=timezone.now() - timedelta(minutes=1))
    assert tick.recover_expired_leases() == 1
    assert run_until_settled(run_id, max_wait=30).status == "completed"
    assert [(row.seq, row.status, row.llm_calls) for row in nodes.all()] == [(1, "completed", 1), (2, "completed", 1)]
    assert [payload["messages"][0]["content"] for payload in chat_server.chat_payloads] == ["First node.",
                                                                                           "Second node."]


def _sequential(*prompts: str) -> dict:
    names = [f"n{index}" for index in range(len(prompts))]
    targets = [[name] for name in names[1:]] + [["end"]]
    return graph(names[0], *(node(name, prompt=prompt, handoffs=handoffs)
                             for name, prompt, handoffs in zip(names, prompts, targets, strict=True)))


def _asked(call) -> tuple[str, str]:
    """(system prompt, task) of a request the server answered: which node of which invocation asked."""
    messages = call[2]["messages"]
    return messages[0]["content"], messages[-1]["content"]


@pytest.mark.worker
@pytest.mark.django_db(transaction=True)
def test_model_calls_of_many_invocations_are_in_flight_at_once(make_version):
    """One turn process and one llm worker: 24 invocations against a provider that takes a second a
    call keep many more than two calls in flight (counted at the server)."""
    with FakeOpenAIChat(latency=3.0) as server:
        version = make_version(_sequential("Only node."))
        invocations = [invocation_start(version=version, input={"text": f"task {i}"}) for i in range(24)]
        with split_workers_running("speed", server.url("/v1"), in_flight=32):
            drive_until_ended(invocations, timeout=120)
        assert {invocation.status for invocation in invocations} == {"completed"}
        assert len(server.calls) == 24
        assert server.peak_in_flight >= 12


@pytest.mark.worker
@pytest.mark.django_db(transaction=True)
def test_a_fans_parallel_branches_call_the_model_at_the_same_time(make_version):
    branches = [f"b{index}" for index in range(8)]
    version = make_version(graph(
        "split", node("split", prompt="Split.", handoffs=branches, kind="parallel"),
        *(node(name, prompt=f"Branch {name}.", handoffs=["join"]) for name in branches),
        node("join", prompt="Join.", wait_for=branches, handoffs=["end"])))
    with FakeOpenAIChat(latency=3.0) as server:
        invocation = invocation_start(version=version, input={"text": "fan out"})
        with split_workers_running("fan", server.url("/v1"), in_flight=16):
            drive_until_ended([invocation], timeout=120)
        assert invocation.status == "completed", invocation.error
        branch_calls = [(start, end) for start, end, body in server.calls
                        if body["messages"][0]["content"].startswith("Branch ")]
        assert len(branch_calls) == 8
        assert peak_overlap(branch_calls) >= 6  # run two at a time, they never overlapped more than 2


@pytest.mark.worker
@pytest.mark.django_db(transaction=True)
def test_a_rate_limited_call_waits_on_a_timer_while_its_worker_serves_another_invocation(make_version, workspace):
    """The llm worker has ONE thread. Invocation A's call is answered 429 (Retry-After 3 s): it waits on a
    durable timer, shown on its node as throttled with the reason, and the one thread serves B's call
    meanwhile; then A's call is made again and A completes."""
    with FakeOpenAIChat() as server:
        original = server.routes["/v1/chat/completions"]
        refused = threading.Event()

        def limited(handler, body):
            if b"Lane A." in body and not refused.is_set():
                refused.set()
                return 429, {"Content-Type": "application/json", "Retry-After": "3"}, json.dumps(
                    {"error": {"message": "Rate limit reached for requests"}})
            return original(handler, body)

        server.routes["/v1/chat/completions"] = limited
        a = invocation_start(version=make_version(_sequential("Lane A.")), input={"text": "a"})
        workers = split_workers("limited", server.url("/v1"), in_flight=1, LLM_MAX_RETRIES="2")
        try:
            assert refused.wait(60), "A's call never reached the server"
            b = invocation_start(version=make_version(_sequential("Lane B.")), input={"text": "b"})
            drive_until_ended([b], timeout=60)
            a.refresh_from_db()
            node_a = NodeInvocation.objects.get(workflow_invocation=a)
            assert b.status == "completed" and a.status == "running"  # B was served while A waited
            assert node_a.throttled and node_a.throttle_reason == "rate limited by openai: retry in 3 s"
            _shows_throttled(a, workspace, "rate limited by openai: retry in 3 s")
            drive_until_ended([a], timeout=60)
        finally:
            stop_process_groups(workers, timeout=20)
        assert a.status == "completed", a.error
        node_a.refresh_from_db()
        assert not node_a.throttled and node_a.throttle_reason == ""
        # answered calls (the refused one is not among them): B's, made while A waited, then A's retry
        assert [body["messages"][0]["content"] for body in server.chat_payloads] == ["Lane B.", "Lane A."]


def _shows_throttled(invocation, workspace, reason: str) -> None:
    """The invocation's API detail and admin page show its node throttled, with the reason."""
    from rest_framework.test import APIClient

    from tests.admin_users import admin_staff, client_of

    staff = admin_staff("operator", workspace, apps=["workflows"])
    api = APIClient()
    api.force_authenticate(user=staff)
    (node_data,) = api.get(reverse("workflow-invocation-detail", args=[invocation.pk])).json()["nodes"]
    assert node_data["throttled"] is True and node_data["throttle_reason"] == reason
    assert node_data["throttled_until"]
    page = client_of(staff).get(reverse("admin:workflows_workflowinvocation_change", args=[invocation.pk]))
    assert f"Throttled: {reason}" in page.content.decode()


@pytest.mark.worker
@pytest.mark.django_db(transaction=True)
def test_an_llm_worker_killed_with_calls_in_flight_asks_no_answered_call_again(make_version):
    """40 invocations of two nodes; the llm worker is SIGKILLed with 30 or more calls in flight. Every
    answer the transcript holds at the kill is never asked again (counted at the server); the calls in
    flight are made again by a second worker and every invocation completes."""
    # a call lasts long enough for one loaded turn process to start 30 more before the first answers
    with FakeOpenAIChat(latency=4.0) as server:
        version = make_version(_sequential("First node.", "Second node."))
        invocations = [invocation_start(version=version, input={"text": f"task {i}"}) for i in range(40)]
        turns, calls = split_workers("crash", server.url("/v1"), in_flight=64)
        workers = [turns, calls]
        try:
            deadline = time.monotonic() + 90
            while not (server.in_flight >= 30 and len(server.calls) >= 20) and time.monotonic() < deadline:
                tick.tick()
                time.sleep(0.05)
            assert server.in_flight >= 30, f"only {server.in_flight} calls were in flight"
            os.killpg(calls.pid, signal.SIGKILL)
            calls.wait(10)
            recorded = set(Message.objects.filter(workflow_invocation__in=invocations, role="assistant")
                           .values_list("workflow_invocation__input__text", "seq"))
            assert recorded, "no answer was recorded before the kill"
            workers.extend(split_workers("resume", server.url("/v1"), in_flight=64))  # both, so both are stopped
            drive_until_ended(invocations, timeout=120)
        finally:
            stop_process_groups(workers, timeout=20)
        assert {invocation.status for invocation in invocations} == {"completed"}
        asked = Counter(_asked(call) for call in server.calls)
        prompts = {1: "First node.", 2: "Second node."}
        for task, seq in recorded:
            assert asked[(prompts[seq // 10_000], task)] == 1, (task, seq)


@pytest.mark.worker
@pytest.mark.django_db(transaction=True)
def test_an_llm_worker_keeps_many_calls_in_flight_on_a_pool_of_two_connections(make_version):
    """The llm worker's threads share its one pool (DATABASE_POOL_MAX_SIZE=2 here) and hold a connection
    only for a call's reads and writes, never across the provider's latency: 24 calls in flight at once
    on at most 2 connections (counted by Postgres)."""
    app = f"lineage-llm-{uuid.uuid4().hex[:8]}"
    with FakeOpenAIChat(latency=3.0) as server:
        version = make_version(_sequential("Only node."))
        invocations = [invocation_start(version=version, input={"text": f"task {i}"}) for i in range(24)]
        workers = split_workers("pool", server.url("/v1"), in_flight=24)
        workers[1].kill()  # the llm worker again, with its pool and an application name to count it by
        workers[1].wait(10)
        workers[1] = worker("pool-llm", server.url("/v1"), queues="llm", pool="threads", concurrency=24,
                            DATABASE_POOL_MAX_SIZE="2", DATABASE_POOL_MIN_SIZE="1", PGAPPNAME=app,
                            DURABLE_STEP_DEFAULT_TIMEOUT="15")
        connections = []
        try:
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline and not all(
                    invocation.status in invocation.TERMINAL for invocation in invocations
                    if invocation.refresh_from_db() or True):
                tick.tick()
                with db_connection.cursor() as cursor:
                    cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", [app])
                    connections.append(cursor.fetchone()[0])
                time.sleep(0.1)
        finally:
            stop_process_groups(workers, timeout=20)
        assert {invocation.status for invocation in invocations} == {"completed"}
        assert server.peak_in_flight >= 16
        assert max(connections) and max(connections) <= 2

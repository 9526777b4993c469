"""The runner with the OpenAI provider: the real `openai` client over HTTP to a local
OpenAI-compatible server (tests/llm/conftest.py), in-process and on real Celery workers."""

import json
import threading
from decimal import Decimal

import pytest

from durable.models import StepCheckpoint
from llm.prices import cost_usd
from tests.llm.conftest import FakeOpenAIChat
from tests.workflows.conftest import graph, node
from tests.workflows.workers import kill_mid_call_and_finish
from workflows.models import Message, NodeInvocation
from workflows.services import invocation_start


@pytest.fixture
def chat_server(settings):
    with FakeOpenAIChat() as server:
        settings.LLM_PROVIDER = "openai"
        settings.OPENAI_API_KEY = "sk-test"
        settings.OPENAI_BASE_URL = server.url("/v1")
        settings.LLM_MAX_RETRIES = 0
        yield server


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

"""OpenTelemetry: an invocation is one trace (invoke_workflow -> invoke_agent -> chat / execute_tool) with the
GenAI conventions' attributes, across turns, queued steps and workers; OTLP/HTTP export; off unless configured."""

import json
import os
import subprocess
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured
from opentelemetry import trace
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from config import telemetry
from durable.inprocess import run_until_settled
from durable.models import DurableRun
from durable.turns import execute_turn
from tests.builders import graph, node
from tests.evals.conftest import facts, support_set  # noqa: F401 (fixtures)
from tests.evolution.conftest import evolve, support_base  # noqa: F401 (fixtures)
from tests.llm.conftest import FakeOpenAIChat
from workflows.services import invocation_decide, invocation_start

pytestmark = pytest.mark.django_db

ROOT = Path(__file__).resolve().parents[2]

TWO_NODES = graph("planner", node("planner", prompt="Plan the answer.", handoffs=["writer"]),
                  node("writer", prompt="Write the answer.", handoffs=["end"]))


@pytest.fixture(autouse=True)
def _no_otel_environment(monkeypatch):
    for name in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_TRACES_EXPORTER", "OTEL_METRICS_EXPORTER", "OTEL_SDK_DISABLED",
                 "OTEL_SERVICE_NAME", telemetry.CAPTURE_CONTENT_ENV):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def spans():
    exporter = InMemorySpanExporter()
    previous = telemetry.install(tracer_provider=telemetry.build_tracer_provider(span_exporter=exporter))
    yield exporter
    telemetry.restore(previous)


def named(exporter, prefix: str) -> list:
    return [span for span in exporter.get_finished_spans() if span.name.startswith(prefix)]


def parent_of(span, exporter):
    (parent,) = [s for s in exporter.get_finished_spans() if s.context.span_id == span.parent.span_id]
    return parent


def test_an_invocation_is_one_trace_of_workflow_agent_and_chat_spans_with_the_genai_attributes(
        spans, make_version, invoke):
    invocation = invoke(make_version(TWO_NODES, name="support"), {"text": "How do durable runs survive a crash?"})
    assert invocation.status == "completed", invocation.error
    assert len({span.context.trace_id for span in spans.get_finished_spans()}) == 1
    (workflow,) = named(spans, "invoke_workflow")
    assert workflow.name == "invoke_workflow support"
    assert workflow.attributes["gen_ai.operation.name"] == "invoke_workflow"
    assert workflow.attributes["gen_ai.usage.input_tokens"] == invocation.input_tokens > 0
    agents = sorted(named(spans, "invoke_agent"), key=lambda span: span.start_time)
    assert [span.name for span in agents] == ["invoke_agent planner", "invoke_agent writer"]
    assert all(parent_of(agent, spans) is workflow for agent in agents)
    chats = named(spans, "chat ")
    assert len(chats) == 2 and {parent_of(chat, spans).name for chat in chats} == {agent.name for agent in agents}
    chat = min(chats, key=lambda span: span.start_time)
    assert parent_of(chat, spans).name == "invoke_agent planner"
    assert chat.kind == trace.SpanKind.CLIENT and chat.name == "chat offline-directive-v1"
    attributes = chat.attributes
    assert attributes["gen_ai.operation.name"] == "chat" and attributes["gen_ai.provider.name"] == "offline"
    assert attributes["gen_ai.request.model"] == attributes["gen_ai.response.model"] == "offline-directive-v1"
    assert attributes["gen_ai.usage.input_tokens"] > 0 and attributes["gen_ai.usage.output_tokens"] > 0
    assert attributes["gen_ai.response.finish_reasons"] == ("stop",)
    assert attributes["gen_ai.request.temperature"] == 0.0
    assert "gen_ai.input.messages" not in attributes and "gen_ai.output.messages" not in attributes
    assert workflow.instrumentation_scope.schema_url == telemetry.SCHEMA_URL
    # the engine's own spans belong to the same trace: the run's start and its turn
    (start,) = [span for span in named(spans, "durable.start")
                if span.attributes["durable.workflow"] == "workflows.invoke"]
    assert parent_of(workflow, spans) is start
    turns = named(spans, "durable.turn")
    assert turns and all(turn.attributes["durable.run.id"] == invocation.durable_run_id for turn in turns)
    assert turns[-1].attributes["durable.turn.outcome"] == "completed"
    assert DurableRun.objects.get(pk=invocation.durable_run_id).trace_context.split("-")[1] == \
        format(start.context.trace_id, "032x")


def test_message_content_is_recorded_only_when_asked(spans, make_version, invoke, monkeypatch):
    version = make_version(graph("a", node("a", prompt="Answer briefly.")))
    invoke(version, {"text": "first question"})
    (chat,) = named(spans, "chat ")
    assert "gen_ai.input.messages" not in chat.attributes
    spans.clear()
    monkeypatch.setenv(telemetry.CAPTURE_CONTENT_ENV, "true")
    invoke(version, {"text": "second question"})
    (chat,) = named(spans, "chat ")
    sent = json.loads(chat.attributes["gen_ai.input.messages"])
    assert sent[0] == {"role": "system", "parts": [{"type": "text", "content": "Answer briefly."}]}
    assert sent[-1] == {"role": "user", "parts": [{"type": "text", "content": "second question"}]}
    (answer,) = json.loads(chat.attributes["gen_ai.output.messages"])
    assert answer["role"] == "assistant" and answer["finish_reason"] == "stop" and answer["parts"][0]["content"]


def test_the_turns_of_a_run_on_separate_workers_continue_its_trace(spans, make_version, owner):
    version = make_version(graph("a", node("a", approval=True)))
    with telemetry.tracer().start_as_current_span("POST /api/invocations/") as request:
        invocation = invocation_start(version=version, input={"text": "approve me"})
    assert execute_turn(invocation.durable_run_id).outcome == "suspended"  # waiting for the approval
    invocation.refresh_from_db()
    assert invocation.status == "waiting"
    invocation_decide(invocation=invocation, decision="approve", user=owner)
    # the next turn, on another worker, inside whatever that worker was doing
    with telemetry.tracer().start_as_current_span("another worker's task") as elsewhere:
        assert execute_turn(invocation.durable_run_id).outcome == "completed"
    turns = named(spans, "durable.turn")
    assert len(turns) == 2
    trace_id = request.get_span_context().trace_id
    assert {turn.context.trace_id for turn in turns} == {trace_id} != {elsewhere.get_span_context().trace_id}
    (start,) = named(spans, "durable.start")
    assert parent_of(start, spans).name == "POST /api/invocations/"
    assert {parent_of(turn, spans).name for turn in turns} == {"durable.start"}
    (agent,) = named(spans, "invoke_agent")  # one span for the node, though it ran across both turns
    assert agent.context.trace_id == trace_id and agent.attributes["lineage.node.status"] == "completed"
    (workflow,) = named(spans, "invoke_workflow")
    # from its begin in the first turn to its end in the second
    assert turns[0].start_time < workflow.start_time < turns[0].end_time < turns[1].start_time < workflow.end_time


def test_queued_model_and_tool_calls_on_the_llm_worker_join_their_nodes_span(spans, make_version, invoke,
                                                                              settings, workspace):
    from knowledge.services import source_create_text

    with FakeOpenAIChat() as server:
        settings.LLM_PROVIDER, settings.OPENAI_API_KEY = "openai", "sk-test"
        settings.OPENAI_BASE_URL, settings.LLM_MAX_RETRIES = server.url("/v1"), 0
        source, _ = source_create_text(workspace=workspace, title="Billing", text="Refunds take five business days.")
        run_until_settled(source.ingest_run_id, max_wait=30)
        spans.clear()
        server.chat_replies = [
            {"tool_calls": [("call_1", "knowledge_search", {"query": "refund delay"})],
             "usage": {"prompt_tokens": 120, "completion_tokens": 20}},
            {"content": "Five business days.", "usage": {"prompt_tokens": 300, "completion_tokens": 8}},
        ]
        version = make_version(graph("a", node("a", tools=["knowledge_search"], model="gpt-4.1-mini")))
        invocation = invoke(version, {"text": "How long is a refund?"})
    assert invocation.status == "completed", invocation.error
    run = DurableRun.objects.get(pk=invocation.durable_run_id)
    assert run.turns > 1  # each model call suspended the turn while the llm queue's worker made it
    steps = [span for span in named(spans, "durable.step") if span.attributes["durable.run.id"] == run.id]
    assert len(steps) == 2 and {step.attributes["durable.step.status"] for step in steps} == {"completed"}
    (agent,) = named(spans, "invoke_agent")
    chats, (tool,) = named(spans, "chat "), named(spans, "execute_tool")
    assert len(chats) == 2 and all(parent_of(chat, spans) is agent for chat in chats)
    assert chats[0].attributes["gen_ai.provider.name"] == "openai"
    assert chats[0].attributes["gen_ai.usage.input_tokens"] == 120
    assert tool.name == "execute_tool knowledge_search" and parent_of(tool, spans) is agent
    assert tool.attributes["gen_ai.tool.call.id"] == "call_1"
    assert len({span.context.trace_id for span in spans.get_finished_spans()}) == 1


def test_a_replayed_node_makes_no_second_chat_span(spans, make_version, invoke):
    version = make_version(graph("a", node("a", approval=True)))
    invocation = invocation_start(version=version, input={"text": "approve me"})
    execute_turn(invocation.durable_run_id)
    assert len(named(spans, "chat ")) == 1
    invocation.refresh_from_db()
    invocation_decide(invocation=invocation, decision="reject", comment="not this one")
    execute_turn(invocation.durable_run_id)  # replays the node's model call from its checkpoint
    assert len(named(spans, "chat ")) == 1
    (agent,) = named(spans, "invoke_agent")
    assert agent.status.status_code == trace.StatusCode.ERROR and "not this one" in agent.status.description
    (workflow,) = named(spans, "invoke_workflow")
    assert workflow.status.status_code == trace.StatusCode.ERROR
    last = named(spans, "durable.turn")[-1]
    assert last.attributes["durable.turn.outcome"] == "failed" and last.status.status_code == trace.StatusCode.ERROR
    assert last.attributes["error.type"] == "NodeRejected" and "not this one" in last.status.description


def test_a_model_call_that_fails_sets_its_spans_status(spans, make_version, invoke, settings):
    with FakeOpenAIChat() as server:
        settings.LLM_PROVIDER, settings.OPENAI_API_KEY = "openai", "sk-test"
        settings.OPENAI_BASE_URL, settings.LLM_MAX_RETRIES = server.url("/v1"), 0
        server.chat_replies = [(400, {"Content-Type": "application/json"},
                                json.dumps({"error": {"message": "this model does not exist"}}))]
        invocation = invoke(make_version(graph("a", node("a", model="gpt-4.1-mini"))))
    assert invocation.status == "failed"
    (chat,) = named(spans, "chat ")
    assert chat.name == "chat gpt-4.1-mini" and chat.status.status_code == trace.StatusCode.ERROR
    assert chat.attributes["error.type"] == "ChatError" and "this model does not exist" in chat.status.description
    (step,) = named(spans, "durable.step")
    assert step.attributes["durable.step.status"] == "failed" and step.status.status_code == trace.StatusCode.ERROR


def test_a_call_a_provider_limit_puts_off_before_sending_has_no_chat_span(spans, settings):
    from llm import limits
    from llm.chat import PutOff, chat
    from llm.errors import CallPutOff
    from llm.types import ChatRequest

    name = f"p{uuid.uuid4().hex[:10]}"
    settings.LLM_PROVIDER = "openai"
    settings.LLM_PROVIDERS = {name: {"base_url": "http://127.0.0.1:9/v1", "requests_per_minute": 1}}
    assert limits.admit(name, "m").admitted  # the minute's one start is taken
    reader = InMemoryMetricReader()
    previous = telemetry.install(tracer_provider=telemetry._state.tracer_provider,
                                 meter_provider=telemetry.build_meter_provider(metric_reader=reader))
    try:
        with telemetry.tracer().start_as_current_span("a judge's step"), pytest.raises(CallPutOff):
            chat(ChatRequest(model=f"{name}#m", messages=[{"role": "user", "content": "hi"}]), put_off=PutOff("x"))
        points = _points(reader)
    finally:
        telemetry.restore(previous)
    assert named(spans, "chat ") == []  # the provider was never asked
    (step,) = named(spans, "a judge's step")
    (event,) = step.events
    assert event.name == "lineage.llm.put_off" and event.attributes["lineage.llm.put_off"] == "limit"
    assert event.attributes["gen_ai.request.model"] == "m" and "rate limited by" in event.attributes["reason"]
    (throttled,) = points["lineage.llm.throttled"]
    assert throttled.value == 1 and throttled.attributes["lineage.llm.put_off"] == "limit"
    assert "lineage.llm.calls" not in points and "gen_ai.client.operation.duration" not in points


def test_a_call_the_provider_refuses_keeps_its_chat_span_with_the_error(spans, settings):
    from llm.chat import PutOff, chat
    from llm.errors import CallPutOff
    from llm.types import ChatRequest

    with FakeOpenAIChat() as server:
        settings.LLM_PROVIDER, settings.OPENAI_API_KEY = "openai", "sk-test"
        settings.OPENAI_BASE_URL, settings.LLM_MAX_RETRIES = server.url("/v1"), 3
        server.chat_replies = [(429, {"Content-Type": "application/json", "Retry-After": "5"},
                                json.dumps({"error": {"message": "Rate limit reached"}}))]
        with pytest.raises(CallPutOff) as caught:
            chat(ChatRequest(model="gpt-4.1-mini", messages=[{"role": "user", "content": "hi"}]), put_off=PutOff("y"))
    assert caught.value.kind == "provider"
    (call,) = named(spans, "chat ")
    assert call.status.status_code == trace.StatusCode.ERROR and "rate limited by openai" in call.status.description
    assert call.attributes["error.type"] == "TransientChatError"
    assert call.attributes["lineage.llm.put_off"] == "provider"


def _points(reader) -> dict:
    return {metric.name: metric.data.data_points for resource in reader.get_metrics_data().resource_metrics
            for scope in resource.scope_metrics for metric in scope.metrics}


def test_an_eval_runs_lanes_and_invocations_are_in_its_trace(spans, workspace, make_version):
    from evals.services import eval_run_start, golden_item_add, golden_set_create

    version = make_version(graph("a", node("a")))
    golden = golden_set_create(workspace=workspace, name="smoke", workflow=version.workflow)
    for text in ("one", "two"):
        golden_item_add(golden_set=golden, input={"text": text}, expected_output=text)
    eval_run = eval_run_start(golden_set=golden, version=version, concurrency=2)
    assert run_until_settled(eval_run.durable_run_id, max_wait=30).status == "completed"
    (span,) = named(spans, "eval_run")
    assert span.name == "eval_run smoke" and span.attributes["lineage.items_done"] == 2
    assert len(named(spans, "invoke_workflow")) == 2
    assert len({s.context.trace_id for s in spans.get_finished_spans()}) == 1


def test_each_generation_of_an_evolution_run_has_a_span_in_the_runs_trace(spans, facts, support_set,  # noqa: F811
                                                                         support_base, evolve):  # noqa: F811
    run = evolve(support_base.workflow, support_set, config={"population": 2, "generations": 2, "seed": 7})
    assert run.status == "completed", run.error
    generations = sorted(named(spans, "evolution_generation"), key=lambda span: span.start_time)
    assert [span.name for span in generations] == ["evolution_generation 0", "evolution_generation 1"]
    assert generations[-1].attributes["lineage.fitness.best"] == pytest.approx(
        run.generations.get(number=1).stats["best"])
    evaluations = named(spans, "eval_run")
    assert len(evaluations) >= 2  # its individuals'
    trace_id = int(DurableRun.objects.get(pk=run.durable_run_id).trace_context.split("-")[1], 16)
    assert {span.context.trace_id for span in generations + evaluations} == {trace_id}
    # the other traces are those of the knowledge sources' ingestions the golden set's facts needed
    elsewhere = {span.attributes["durable.workflow"] for span in named(spans, "durable.start")
                 if span.context.trace_id != trace_id}
    assert elsewhere == {"knowledge.ingest_source"}


def test_metrics_count_turns_model_calls_tokens_and_cost(make_version, invoke):
    reader = InMemoryMetricReader()
    previous = telemetry.install(meter_provider=telemetry.build_meter_provider(metric_reader=reader))
    try:
        invocation = invoke(make_version(TWO_NODES))
        data = reader.get_metrics_data()
    finally:
        telemetry.restore(previous)
    points = {metric.name: metric.data.data_points for resource in data.resource_metrics
              for scope in resource.scope_metrics for metric in scope.metrics}
    (calls,) = points["lineage.llm.calls"]
    assert calls.value == 2 and calls.attributes["lineage.llm.outcome"] == "ok"
    tokens = {point.attributes["gen_ai.token.type"]: point.sum for point in points["gen_ai.client.token.usage"]}
    assert tokens == {"input": invocation.input_tokens, "output": invocation.output_tokens}
    assert sum(point.value for point in points["lineage.llm.calls.in_flight"]) == 0
    outcomes = {point.attributes["durable.turn.outcome"] for point in points["lineage.durable.turn.duration"]}
    assert "completed" in outcomes
    assert "gen_ai.client.operation.duration" in points and "lineage.llm.cost" in points


@pytest.fixture
def scraped(monkeypatch):
    """Metrics kept for Prometheus's scrapes as OTEL_METRICS_EXPORTER=prometheus sets them up (in a registry
    of the test's own)."""
    from prometheus_client import CollectorRegistry

    monkeypatch.setenv("OTEL_METRICS_EXPORTER", "prometheus")
    registry = CollectorRegistry()
    provider = telemetry.build_meter_provider(scrape_registry=registry)
    previous = telemetry.install(meter_provider=provider, scrape_registry=registry)
    yield registry
    telemetry.restore(previous)
    provider.shutdown()


def _families(text: str) -> dict[str, str]:
    """A Prometheus text scrape's metric families: name -> type."""
    return dict(line.split()[2:4] for line in text.splitlines() if line.startswith("# TYPE "))


def test_metrics_answers_a_prometheus_scrape_with_the_model_calls_tokens_and_turns(scraped, make_version, invoke,
                                                                                    client):
    invocation = invoke(make_version(TWO_NODES, name="scraped"))
    assert invocation.status == "completed"
    response = client.get("/metrics")
    assert response.status_code == 200
    assert response["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
    text = response.content.decode()
    assert _families(text) == {
        "target_info": "gauge",
        "lineage_durable_turn_duration_seconds": "histogram",
        "gen_ai_client_operation_duration_seconds": "histogram",
        "gen_ai_client_token_usage": "histogram",
        "lineage_llm_calls_total": "counter",
        "lineage_llm_cost_USD_total": "counter",
        "lineage_llm_calls_in_flight": "gauge",
    }
    samples = {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line and not line.startswith("#")}
    scope = 'otel_scope_name="lineage",otel_scope_schema_url="https://opentelemetry.io/schemas/1.37.0",' \
            'otel_scope_version=""'
    model = 'gen_ai_provider_name="offline",gen_ai_request_model="offline-directive-v1"'
    assert samples[f'lineage_llm_calls_total{{{model},lineage_llm_outcome="ok",{scope}}}'] == 2
    tokens = {kind: value for key, value in samples.items() for kind in ("input", "output")
              if key.startswith("gen_ai_client_token_usage_sum{") and f'gen_ai_token_type="{kind}"' in key}
    assert tokens == {"input": invocation.input_tokens, "output": invocation.output_tokens}
    turns = [key for key in samples if key.startswith("lineage_durable_turn_duration_seconds_count{")]
    assert any('durable_turn_outcome="completed"' in key and 'durable_workflow="workflows.invoke"' in key
               for key in turns)
    # buckets fine enough for quantiles of turns and calls that take milliseconds, and of a few hundred tokens
    bounds = {name: {key.split('le="')[1].split('"')[0] for key in samples if key.startswith(f"{name}_bucket{{")}
              for name in ("lineage_durable_turn_duration_seconds", "gen_ai_client_operation_duration_seconds",
                           "gen_ai_client_token_usage")}
    assert {"0.01", "0.08", "1.28"} <= bounds["lineage_durable_turn_duration_seconds"]
    assert {"0.01", "0.08", "1.28"} <= bounds["gen_ai_client_operation_duration_seconds"]
    assert {"16.0", "64.0", "256.0", "1024.0"} <= bounds["gen_ai_client_token_usage"]


def test_metrics_is_not_found_unless_prometheus_scrapes_are_configured(client):
    assert client.get("/metrics").status_code == 404


def test_metrics_asks_for_the_bearer_token_when_one_is_set(scraped, client, settings):
    settings.METRICS_TOKEN = "s3cret-scrape-token"
    refused = client.get("/metrics")
    assert refused.status_code == 401 and refused["WWW-Authenticate"] == 'Bearer realm="metrics"'
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer wrong").status_code == 401
    answered = client.get("/metrics", HTTP_AUTHORIZATION="Bearer s3cret-scrape-token")
    assert answered.status_code == 200 and answered["Content-Type"].startswith("text/plain; version=0.0.4")


class _Receiver(BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.server.posts.append((self.path, self.headers.get("Content-Type"), body))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture
def otlp_receiver():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Receiver)
    server.posts = []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def test_an_invocations_spans_reach_an_otlp_http_endpoint(otlp_receiver, monkeypatch, make_version, invoke):
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{otlp_receiver.server_address[1]}")
    assert telemetry.tracing_configured()
    provider = telemetry.build_tracer_provider()
    previous = telemetry.install(tracer_provider=provider)
    try:
        invocation = invoke(make_version(TWO_NODES, name="exported"))
        telemetry.flush()
    finally:
        telemetry.restore(previous)
        provider.shutdown()
    assert invocation.status == "completed"
    names, services = [], set()
    for path, content_type, body in otlp_receiver.posts:
        assert path == "/v1/traces" and content_type == "application/x-protobuf"
        request = ExportTraceServiceRequest.FromString(body)
        for resource_spans in request.resource_spans:
            services |= {a.value.string_value for a in resource_spans.resource.attributes if a.key == "service.name"}
            names += [span.name for scope in resource_spans.scope_spans for span in scope.spans]
    assert services == {"lineage"}
    assert "invoke_workflow exported" in names and "invoke_agent planner" in names and "invoke_agent writer" in names
    assert names.count("chat offline-directive-v1") == 2


def _received_spans(receiver) -> list[tuple[str, int, str]]:
    """(span name, trace id, instrumentation scope) of every span the receiver got."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    found = []
    for path, _content_type, body in list(receiver.posts):
        if path == "/v1/traces":
            for resource_spans in ExportTraceServiceRequest.FromString(body).resource_spans:
                found += [(span.name, int.from_bytes(span.trace_id, "big"), scope.scope.name)
                          for scope in resource_spans.scope_spans for span in scope.spans]
    return found


@pytest.mark.worker
@pytest.mark.django_db(transaction=True)
def test_celery_workers_set_up_tracing_and_continue_the_trace_the_api_started(otlp_receiver, monkeypatch,
                                                                              make_version):
    from tests.workflows.workers import drive_until_ended, split_workers_running

    endpoint = f"http://127.0.0.1:{otlp_receiver.server_address[1]}"
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)
    version = make_version(TWO_NODES, name="on workers")
    provider = telemetry.build_tracer_provider()
    previous = telemetry.install(tracer_provider=provider)
    try:
        with telemetry.tracer().start_as_current_span("POST /api/invocations/") as request:
            invocation = invocation_start(version=version, input={"text": "traced on workers"})
    finally:
        telemetry.restore(previous)
        provider.shutdown()
    with FakeOpenAIChat() as server, split_workers_running("otel", server.url("/v1"), OTEL_METRICS_EXPORTER="none",
                                                           OTEL_BSP_SCHEDULE_DELAY="100"):
        drive_until_ended([invocation], timeout=120)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not any(
                name.startswith("invoke_workflow") for name, _, _ in _received_spans(otlp_receiver)):
            time.sleep(0.2)
    assert invocation.status == "completed", invocation.error
    received = _received_spans(otlp_receiver)
    ours = [(name, trace_id) for name, trace_id, scope in received if scope == telemetry.INSTRUMENTATION_NAME]
    names = [name for name, _ in ours]
    # the model calls ran on the threads-pool llm worker, the turns on the prefork one
    assert names.count("chat gpt-4.1-mini") == 2 and names.count("invoke_agent planner") == 1
    assert "invoke_workflow on workers" in names and "durable.turn" in names and "durable.step" in names
    assert {trace_id for _, trace_id in ours} == {request.get_span_context().trace_id}
    # and the instrumentations are on in the workers: their Celery tasks and queries are traced too
    scopes = {scope for _, _, scope in received}
    assert {"opentelemetry.instrumentation.celery", "opentelemetry.instrumentation.psycopg"} <= scopes


@pytest.mark.django_db(transaction=True)
def test_a_management_commands_spans_are_exported_before_it_exits(otlp_receiver, make_version):
    from tests.workflows.workers import test_database_url

    version = make_version(TWO_NODES, name="from the shell")
    environment = {**os.environ, "DATABASE_URL": test_database_url(), "OTEL_METRICS_EXPORTER": "none",
                   "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{otlp_receiver.server_address[1]}"}
    result = subprocess.run([sys.executable, "manage.py", "workflow", "run", str(version.pk), "--input",
                             '{"text": "traced from a command"}'], cwd=ROOT, env=environment, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    names = [name for name, _, scope in _received_spans(otlp_receiver) if scope == telemetry.INSTRUMENTATION_NAME]
    assert "invoke_workflow from the shell" in names and names.count("chat offline-directive-v1") == 2
    assert "durable.turn" in names


def _free_port_base(offsets) -> int:
    """A port such that it plus each of `offsets` is free on loopback now."""
    import random
    import socket

    for _ in range(50):
        base = random.randrange(20_000, 60_000)
        try:
            for offset in offsets:
                with socket.socket() as probe:
                    probe.bind(("127.0.0.1", base + offset))
        except OSError:
            continue
        return base
    raise AssertionError("no free ports")


def _scrape(port: int, *, timeout: float = 30) -> str:
    import urllib.request

    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
                return answer.read().decode()
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


@pytest.mark.worker
@pytest.mark.django_db(transaction=True)
def test_each_celery_worker_process_serves_its_own_metrics_on_its_kinds_port(make_version):
    from tests.workflows.workers import drive_until_ended, split_workers_running

    offsets = (telemetry.SCRAPE_PORT_OFFSETS["worker"], telemetry.SCRAPE_PORT_OFFSETS["llm"])
    base = _free_port_base(offsets)
    invocation = invocation_start(version=make_version(TWO_NODES), input={"text": "scraped on workers"})
    with FakeOpenAIChat() as server, split_workers_running("scraped", server.url("/v1"), OTEL_METRICS_EXPORTER=
                                                           "prometheus", METRICS_PROMETHEUS_PORT=str(base)):
        drive_until_ended([invocation], timeout=120)
        turns, calls = (_families(_scrape(base + offset)) for offset in offsets)
    assert invocation.status == "completed", invocation.error
    # the turns ran on the prefork worker's one child (index 0), the model calls on the threads-pool worker
    assert turns["lineage_durable_turn_duration_seconds"] == "histogram" and "lineage_llm_calls_total" not in turns
    assert calls["lineage_llm_calls_total"] == "counter" and calls["gen_ai_client_token_usage"] == "histogram"
    assert "lineage_durable_step_duration_seconds" in calls and "process_resident_memory_bytes" in calls


def test_tracing_is_off_unless_configured(make_version, invoke, monkeypatch):
    assert not telemetry.tracing_configured() and not telemetry.metrics_configured()
    previous = telemetry.install()
    try:
        assert telemetry.setup() is False
        assert not telemetry.tracing()
        assert not isinstance(trace.get_tracer_provider(), telemetry_sdk_provider())
        invocation = invoke(make_version(TWO_NODES))
    finally:
        telemetry.restore(previous)
    assert invocation.status == "completed"
    assert DurableRun.objects.get(pk=invocation.durable_run_id).trace_context == ""
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "none")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318")
    assert not telemetry.tracing_configured() and telemetry.metrics_configured()


def telemetry_sdk_provider():
    from opentelemetry.sdk.trace import TracerProvider

    return TracerProvider


def test_off_imports_no_sdk():
    code = ("import sys; from config import telemetry; assert telemetry.setup() is False; "
            "print(sorted(name for name in sys.modules if name.startswith('opentelemetry.sdk')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"},
                         check=True, cwd=Path(__file__).parents[2])
    assert out.stdout.strip() == "[]"


def test_an_unknown_exporter_is_refused_naming_the_variable(monkeypatch):
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "jaeger")
    with pytest.raises(ImproperlyConfigured, match="OTEL_TRACES_EXPORTER"):
        telemetry.tracing_configured()

"""The OpenAI chat provider through the real `openai` client, talking HTTP to a local
OpenAI-compatible server (tests/openai_server.py), reached through `llm.chat.chat`."""

import json
from decimal import Decimal

import pytest

from llm import retry
from llm.chat import chat
from llm.errors import ChatError, TransientChatError
from llm.types import ChatRequest, ToolSpec
from llm.usage import usage_meter

SEARCH = ToolSpec("knowledge_search", "Search the knowledge base.",
                  {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]})
JSON_ERROR = {"Content-Type": "application/json"}


@pytest.fixture
def online(settings, openai_server, monkeypatch):
    """Settings with a key and OPENAI_BASE_URL on the local server; sleeps recorded instead of slept."""
    settings.LLM_PROVIDER = "openai"
    settings.OPENAI_API_KEY = "sk-test"
    settings.OPENAI_BASE_URL = openai_server.url("/v1")
    settings.LLM_MAX_RETRIES = 3
    settings.LLM_RETRY_BACKOFF_SECONDS = 0.5
    settings.LLM_RETRY_BACKOFF_CAP_SECONDS = 10.0
    sleeps: list[float] = []
    monkeypatch.setattr(retry, "_sleep", sleeps.append)
    openai_server.sleeps = sleeps
    return openai_server


def _messages(question="What is Lineage?"):
    return [{"role": "system", "content": "You are concise."}, {"role": "user", "content": question}]


def test_plain_answer_with_usage_priced_from_the_table(online):
    online.chat_replies = [{"content": "Lineage runs durable agent workflows.", "model": "gpt-4.1-mini-2025-04-14",
                            "usage": {"prompt_tokens": 1000, "completion_tokens": 500}}]
    with usage_meter() as meter:
        response, cached = chat(ChatRequest(model="gpt-4.1-mini", messages=_messages(), max_tokens=200))
    assert not cached
    assert response.content == "Lineage runs durable agent workflows."
    assert response.tool_calls == () and response.finish_reason == "stop"
    # the model that answered (a dated snapshot) is priced as its family: 0.40 in, 1.60 out per million
    assert response.usage.provider == "openai" and response.usage.model == "gpt-4.1-mini-2025-04-14"
    assert (response.usage.input_tokens, response.usage.output_tokens) == (1000, 500)
    assert response.usage.usd_cost == Decimal("0.0012")
    assert meter.total == response.usage  # recorded once
    assert response.latency_ms > 0
    payload = online.chat_payloads[0]
    assert payload["model"] == "gpt-4.1-mini" and payload["messages"] == _messages()
    assert payload["temperature"] == 0.0 and payload["max_tokens"] == 200
    assert "tools" not in payload and "response_format" not in payload
    assert online.requests[0]["headers"]["authorization"] == "Bearer sk-test"


def test_tool_calls_round_trip(online):
    online.chat_replies = [
        {"content": None, "tool_calls": [("call_1", "knowledge_search", {"query": "lineage"})]},
        {"content": "Lineage is a workflow platform [1]."},
    ]
    messages = _messages()
    first, _ = chat(ChatRequest(model="gpt-4.1-mini", messages=messages, tools=(SEARCH,)))
    assert first.content == "" and first.finish_reason == "tool_calls"
    (call,) = first.tool_calls
    assert (call.id, call.name, call.arguments) == ("call_1", "knowledge_search", {"query": "lineage"})
    sent = online.chat_payloads[0]
    assert sent["tools"] == [SEARCH.as_openai()] and sent["tool_choice"] == "auto"

    history = [*messages, first.assistant_message(),
               {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"hits": []})}]
    second, _ = chat(ChatRequest(model="gpt-4.1-mini", messages=history, tools=(SEARCH,)))
    assert second.content == "Lineage is a workflow platform [1]."
    follow_up = online.chat_payloads[1]["messages"]
    assert follow_up[2] == {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function",
         "function": {"name": "knowledge_search", "arguments": '{"query": "lineage"}'}},
    ]}
    assert follow_up[3]["role"] == "tool" and follow_up[3]["tool_call_id"] == "call_1"


def test_tool_call_with_bad_json_arguments_keeps_the_raw_text(online):
    online.chat_replies = [{"content": None, "tool_calls": [("call_9", "knowledge_search", "{query: oops")]}]
    response, _ = chat(ChatRequest(model="gpt-4.1-mini", messages=_messages(), tools=(SEARCH,)))
    (call,) = response.tool_calls
    assert call.arguments == {} and call.raw == "{query: oops"
    assert response.assistant_message()["tool_calls"][0]["function"]["arguments"] == "{query: oops"


def test_json_response_format_is_sent_and_answered(online):
    schema = {"type": "json_schema", "json_schema": {"name": "answer", "schema": {
        "type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]}}}
    online.chat_replies = [{"content": '{"answer": "durable workflows"}'}]
    response, _ = chat(ChatRequest(model="gpt-4.1-mini", messages=_messages(), response_format=schema))
    assert json.loads(response.content) == {"answer": "durable workflows"}
    assert online.chat_payloads[0]["response_format"] == schema


def test_rate_limit_is_retried_after_the_servers_retry_after(online):
    online.chat_replies = [
        (429, {**JSON_ERROR, "Retry-After": "2"}, '{"error": {"message": "Rate limit reached"}}'),
        (503, JSON_ERROR, '{"error": {"message": "overloaded"}}'),
        {"content": "finally"},
    ]
    response, _ = chat(ChatRequest(model="gpt-4.1-mini", messages=_messages()))
    assert response.content == "finally"
    assert len(online.chat_payloads) == 3
    assert online.sleeps[0] == 2.0  # the server's Retry-After
    assert 0.5 <= online.sleeps[1] <= 1.0  # then backoff: 0.5 * 2**1 with jitter in [50%, 100%]


def test_transient_errors_give_up_after_the_retries(online):
    online.chat_replies = [(429, JSON_ERROR, '{"error": {"message": "slow down"}}')] * 4
    with pytest.raises(TransientChatError, match=r"after 4 attempts.*slow down"):
        chat(ChatRequest(model="gpt-4.1-mini", messages=_messages()))
    assert len(online.chat_payloads) == 4 and len(online.sleeps) == 3


def test_bad_request_fails_at_once_with_the_servers_message(online):
    online.chat_replies = [(400, JSON_ERROR, '{"error": {"message": "Invalid schema for response_format"}}')]
    with pytest.raises(ChatError, match=r"\(400\): Invalid schema for response_format") as caught:
        chat(ChatRequest(model="gpt-4.1-mini", messages=_messages()))
    assert not isinstance(caught.value, TransientChatError)
    assert online.sleeps == [] and len(online.chat_payloads) == 1


def test_provider_prefix_maps_to_its_base_url_and_key(online, settings, monkeypatch):
    with type(online)() as other:
        settings.LLM_PROVIDERS = {"local": {"base_url": other.url("/v1"), "api_key_env": "LOCAL_LLM_KEY"}}
        monkeypatch.setenv("LOCAL_LLM_KEY", "sk-local")
        other.chat_replies = [{"content": "from the local server", "usage": {"prompt_tokens": 7,
                                                                             "completion_tokens": 3}}]
        response, _ = chat(ChatRequest(model="local#qwen2.5:7b", messages=_messages()))
        assert response.content == "from the local server"
        assert other.chat_payloads[0]["model"] == "qwen2.5:7b"  # the prefix is not sent
        assert other.requests[0]["headers"]["authorization"] == "Bearer sk-local"
        assert online.chat_payloads == []  # the default provider was not asked
        # a model with no known price is counted in tokens at 0 USD
        assert response.usage.provider == "local" and response.usage.model == "qwen2.5:7b"
        assert response.usage.usd_cost == Decimal(0) and response.usage.input_tokens == 7


def test_server_without_usage_is_estimated_not_free(online):
    online.chat_replies = [{"content": "an answer of some length", "usage": None}]
    response, _ = chat(ChatRequest(model="gpt-4.1-mini", messages=_messages()))
    assert response.usage.input_tokens > 0 and response.usage.output_tokens > 0
    assert response.usage.usd_cost > 0


@pytest.mark.parametrize("model", ["o4-mini", "o3", "gpt-5-mini", "openai/gpt-5"])
def test_a_reasoning_model_gets_max_completion_tokens_and_no_temperature(online, model):
    online.chat_replies = [{"content": "thought it through"}]
    response, _ = chat(ChatRequest(model=model, messages=_messages(), max_tokens=300, temperature=0.0))
    assert response.content == "thought it through"
    payload = online.chat_payloads[0]
    assert payload["max_completion_tokens"] == 300
    assert "max_tokens" not in payload and "temperature" not in payload


def test_model_options_setting_adds_to_the_table(online, settings):
    settings.LLM_MODEL_OPTIONS = {"qwen3*": {"temperature": False, "extra_body": {"reasoning_effort": "low"}},
                                  "gpt-4.1*": {"token_limit_param": "max_completion_tokens"}}
    chat(ChatRequest(model="qwen3:8b", messages=_messages(), max_tokens=50))
    chat(ChatRequest(model="gpt-4.1-mini", messages=_messages(), max_tokens=50))
    qwen, gpt = online.chat_payloads
    assert qwen["reasoning_effort"] == "low" and "temperature" not in qwen and qwen["max_tokens"] == 50
    assert gpt["max_completion_tokens"] == 50 and gpt["temperature"] == 0.0


def test_in_a_durable_step_a_rate_limit_is_put_off_not_slept(online):
    from llm.chat import PutOff
    from llm.errors import CallPutOff

    online.chat_replies = [(429, {**JSON_ERROR, "Retry-After": "8"}, '{"error": {"message": "Rate limit"}}')]
    with pytest.raises(CallPutOff) as caught:
        chat(ChatRequest(model="gpt-4.1-mini", messages=_messages()), put_off=PutOff(caller="c1"))
    assert caught.value.kind == "provider" and caught.value.retry_in == 8.0
    assert caught.value.reason == "rate limited by openai: retry in 8 s"
    assert online.sleeps == [] and len(online.chat_payloads) == 1
    # the policy's retries are counted across the step's tries: the fourth failure is the last
    online.chat_replies = [(503, JSON_ERROR, '{"error": {"message": "overloaded"}}')]
    with pytest.raises(TransientChatError, match=r"after 4 attempts.*overloaded"):
        chat(ChatRequest(model="gpt-4.1-mini", messages=_messages()), put_off=PutOff(caller="c1", retries_done=3))
    assert online.sleeps == []


@pytest.mark.parametrize("structured", [True, False])
def test_a_json_schema_response_format_reaches_only_a_provider_with_structured_outputs(online, settings, structured):
    """Whoever builds the request (a node's outputSchema, the conditional router's choice), a json_schema
    response_format goes only to a provider whose structured_outputs flag is on; the prompts ask for JSON."""
    settings.LLM_PROVIDERS = {"local": {"base_url": online.url("/v1"), "structured_outputs": structured}}
    route = {"type": "json_schema", "json_schema": {"name": "route", "strict": True, "schema": {"type": "object"}}}
    chat(ChatRequest(model="local#qwen2.5:14b", messages=_messages(), response_format=route))
    (payload,) = online.chat_payloads
    assert ("response_format" in payload) is structured


@pytest.mark.parametrize("body, content_type", [
    ("<html>502 Bad Gateway</html>", "text/html"),
    ("not json at all", "application/json"),
    ('{"object": "list", "data": []}', "application/json"),
    ('{"id": "x", "object": "chat.completion", "choices": [{"index": 0}]}', "application/json"),
    ('{"id": "x", "object": "chat.completion", "choices": "none"}', "application/json"),
])
def test_a_200_that_is_not_a_chat_completion_fails_as_a_chat_error_naming_the_provider(online, body, content_type):
    online.chat_replies = [(200, {"Content-Type": content_type}, body)]
    with pytest.raises(ChatError, match=r"openai answered the chat request with") as caught:
        chat(ChatRequest(model="gpt-4.1-mini", messages=_messages()))
    assert not isinstance(caught.value, TransientChatError)
    assert len(online.chat_payloads) == 1


def _completion(choice=None, usage=None, **fields) -> str:
    return json.dumps({"id": "x", "object": "chat.completion", "created": 1, "model": "gpt-4.1-mini",
                       "choices": [choice if choice is not None else _message(content="hi")],
                       "usage": usage if usage is not None else {"prompt_tokens": 5, "completion_tokens": 2},
                       **fields})


def _message(**fields) -> dict:
    return {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", **fields}}


@pytest.mark.parametrize("body", [
    _completion({"index": 0, "finish_reason": "stop", "message": None}),
    _completion(_message(content=None, tool_calls="call it")),
    _completion(_message(content=None, tool_calls=[{"id": "c1", "type": "function", "function": "search"}])),
    _completion(_message(content=None, tool_calls=[{"id": "c1", "type": "function",
                                                    "function": {"name": None, "arguments": "{}"}}])),
    _completion(_message(content=None, tool_calls=[{"id": None, "type": "function",
                                                    "function": {"name": "knowledge_search", "arguments": "{}"}}])),
    _completion(_message(content=["a", "list"])),
    _completion(_message(content=42)),
    _completion(usage={"prompt_tokens": "many", "completion_tokens": 1}),
    _completion(usage={"prompt_tokens": -1000000, "completion_tokens": 1}),
    _completion(usage={"prompt_tokens": 10 ** 30, "completion_tokens": 1}),
    _completion(usage={"prompt_tokens": 1e400, "completion_tokens": 1}),
    _completion(usage={"prompt_tokens": 1, "completion_tokens": 1, "prompt_tokens_details": {"cached_tokens": -5}}),
    _completion(model=["gpt"]),
])
def test_a_hostile_chat_completion_fails_as_a_chat_error(online, body):
    online.chat_replies = [(200, JSON_ERROR, body)]
    with usage_meter() as meter, pytest.raises(ChatError, match=r"openai answered the chat request with") as caught:
        chat(ChatRequest(model="gpt-4.1-mini", messages=_messages(), tools=(SEARCH,)))
    assert not isinstance(caught.value, TransientChatError)
    assert meter.records == []  # nothing counted of an answer that was not one


def test_a_lenient_servers_completion_still_parses(online):
    # no usage, no finish reason, no created, numbers as the server counted them (a float, a numeric string)
    online.chat_replies = [(200, JSON_ERROR, json.dumps({"choices": [{"message": {
        "content": None, "tool_calls": [{"id": "c1", "function": {"name": "knowledge_search",
                                                                  "arguments": '{"query": "q"}'}}]}}]})),
                           (200, JSON_ERROR, _completion(usage={"prompt_tokens": 12.0, "completion_tokens": "3"}))]
    response, _ = chat(ChatRequest(model="gpt-4.1-mini", messages=_messages(), tools=(SEARCH,)))
    assert response.content == "" and response.finish_reason == "tool_calls"
    assert [(call.id, call.name, call.arguments) for call in response.tool_calls] == [
        ("c1", "knowledge_search", {"query": "q"})]
    assert response.usage.input_tokens > 0
    response, _ = chat(ChatRequest(model="gpt-4.1-mini", messages=_messages()))
    assert response.content == "hi" and (response.usage.input_tokens, response.usage.output_tokens) == (12, 3)

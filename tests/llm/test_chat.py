"""The chat interface: which provider a model name reaches, the cache hook, retries, and the
request/response shapes the workflow runner stores."""

import json
from decimal import Decimal

import pytest
from django.core.exceptions import ImproperlyConfigured

from config.settings.llm import _providers
from llm import chat as chat_module
from llm import retry
from llm.chat import chat, model_problem, structured_output_format
from llm.errors import ChatError, TransientChatError, UnknownModel
from llm.names import ResolvedModel, resolve_model
from llm.providers import ProviderLimits, provider_config, provider_limits
from llm.types import ChatProvider, ChatRequest, ChatResponse, ToolCall, ToolSpec
from llm.usage import Usage, usage_meter

OFFLINE = ResolvedModel("offline", "offline-directive-v1", None, "")
MESSAGES = [{"role": "system", "content": "Answer in one sentence."},
            {"role": "user", "content": "Lineage keeps every version. What does Lineage keep?"}]


@pytest.fixture
def offline_mode(settings):
    settings.LLM_PROVIDER = "offline"
    settings.LLM_PROVIDERS = {"openrouter": {"base_url": "https://openrouter.example/api/v1",
                                             "api_key_env": "OPENROUTER_API_KEY"}}
    return settings


@pytest.fixture
def online_mode(settings, monkeypatch):
    settings.LLM_PROVIDER = "openai"
    settings.OPENAI_API_KEY = "sk-openai"
    settings.OPENAI_BASE_URL = "http://127.0.0.1:9/v1"
    settings.LLM_PROVIDERS = {"openrouter": {"base_url": "https://openrouter.example/api/v1",
                                             "api_key_env": "OPENROUTER_API_KEY"}}
    monkeypatch.setenv("OPENROUTER_API_KEY", "sk-router")
    return settings


# ------------------------------------------------------------------------------------ resolution


def test_offline_mode_answers_every_bare_or_configured_model_offline(offline_mode):
    for name in ("gpt-4.1-mini", "openai#gpt-4.1", "openrouter#openai/gpt-4.1-mini", "offline#anything",
                 "offline-directive-v1", "OpenRouter#x"):
        assert resolve_model(name) == OFFLINE, name
        assert model_problem(name) is None


def test_offline_mode_answers_a_prefix_no_provider_serves_offline(offline_mode):
    """The seed system's exported workflows name "openrouter#..." models: in the demo (no key, no provider
    configured) they run on the offline model, labelled as such, instead of being refused."""
    offline_mode.LLM_PROVIDERS = {}
    for name in ("openrouter#openai/gpt-4.1-mini", "acme#big-model", "anthropic#claude-sonnet-4"):
        assert model_problem(name) is None, name
        assert resolve_model(name) == OFFLINE
    response, _ = chat(ChatRequest(model="openrouter#openai/gpt-4.1-mini", messages=MESSAGES))
    assert (response.usage.provider, response.usage.model) == ("offline", "offline-directive-v1")


def test_an_unconfigured_prefix_is_an_unknown_model_online(offline_mode):
    offline_mode.LLM_PROVIDER = "openai"
    offline_mode.OPENAI_API_KEY = "sk-openai"
    assert 'provider "acme" is not configured (LLM_PROVIDERS' in model_problem("acme#big-model")
    with pytest.raises(UnknownModel, match="'acme#big-model'"):
        resolve_model("acme#big-model")


def test_online_mode_maps_prefixes_to_providers(online_mode):
    assert resolve_model("gpt-4.1-mini") == ResolvedModel("openai", "gpt-4.1-mini", "http://127.0.0.1:9/v1",
                                                          "sk-openai")
    assert resolve_model("openai#gpt-4o") == ResolvedModel("openai", "gpt-4o", "http://127.0.0.1:9/v1", "sk-openai")
    assert resolve_model("openrouter#openai/gpt-4.1-mini") == ResolvedModel(
        "openrouter", "openai/gpt-4.1-mini", "https://openrouter.example/api/v1", "sk-router")
    # the offline model stays reachable by name
    assert resolve_model("offline-directive-v1") == OFFLINE
    assert resolve_model("offline#gpt-4.1-mini") == OFFLINE


def test_a_provider_without_its_key_is_a_model_problem(online_mode, monkeypatch):
    monkeypatch.delenv("OPENROUTER_API_KEY")
    assert model_problem("openrouter#x") == ("Model 'openrouter#x': provider \"openrouter\" has no API key "
                                             "(set OPENROUTER_API_KEY).")
    # a server that needs no key names no variable
    online_mode.LLM_PROVIDERS = {"ollama": {"base_url": "http://127.0.0.1:11434/v1", "api_key_env": None}}
    assert resolve_model("ollama#qwen2.5").api_key == ""


def test_malformed_model_names():
    assert model_problem("") == "The model name is empty."
    assert "empty provider prefix" in model_problem("#gpt-4.1")
    assert "names no model" in model_problem("openai#")


def test_provider_settings_are_validated():
    assert _providers("") == {}
    assert _providers('{"local": {"base_url": "http://127.0.0.1:8000/v1"}}') == {
        "local": {"base_url": "http://127.0.0.1:8000/v1", "api_key_env": None, "structured_outputs": False,
                  "max_concurrency": None, "requests_per_minute": None, "models": {}}}
    for raw, message in [
        ("[1]", "must be a JSON object"), ("{", "not valid JSON"),
        ('{"offline": {"base_url": "http://x"}}', "cannot be replaced"),
        ('{"local": {"base_url": "ftp://x"}}', "http\\(s\\) URL"),
        ('{"local": {}}', "base_url is required"),
        ('{"local": {"base_url": "http://x", "key": "sk"}}', "only \\(key\\)"),
        ('{"Local Server": {"base_url": "http://x"}}', "lower-case"),
        ('{"local": {"base_url": "http://x", "max_concurrency": 0}}', "max_concurrency must be a whole number"),
        ('{"local": {"base_url": "http://x", "requests_per_minute": "60"}}', "requests_per_minute must be"),
        ('{"local": {"base_url": "http://x", "structured_outputs": "yes"}}', "structured_outputs must be true"),
        ('{"local": {"base_url": "http://x", "models": {"m": {"rpm": 1}}}}', "\\['models'\\]\\['m'\\]"),
    ]:
        with pytest.raises(ImproperlyConfigured, match=message):
            _providers(raw)


def test_provider_limits_per_provider_and_per_model(settings):
    settings.LLM_PROVIDERS = _providers(json.dumps({"ollama": {
        "base_url": "http://127.0.0.1:11434/v1", "structured_outputs": True, "max_concurrency": 4,
        "requests_per_minute": 600, "models": {"qwen2.5:14b": {"max_concurrency": 1}}}}))
    ollama = provider_config("ollama")
    assert ollama.structured_outputs and ollama.url() == "http://127.0.0.1:11434/v1" and ollama.api_key() == ""
    assert provider_limits("ollama", "llama3.2") == ProviderLimits(max_concurrency=4, requests_per_minute=600)
    # a model's own limit wins, the provider's fills in the rest
    assert provider_limits("ollama", "qwen2.5:14b") == ProviderLimits(max_concurrency=1, requests_per_minute=600)
    assert provider_limits("openai", "gpt-4.1-mini") == ProviderLimits()
    assert provider_config("openai").structured_outputs and not provider_config("offline").structured_outputs


def test_threads_asking_at_once_share_one_client_of_a_provider(online_mode):
    # the llm worker's threads all start on a cold process: one client (one connection pool to the
    # provider) for them all, not one each
    import threading

    from llm.chat import get_chat_provider

    chat_module._openai_provider.cache_clear()
    resolved = resolve_model("openrouter#openai/gpt-4.1-mini")
    start, got = threading.Barrier(16), []

    def ask():
        start.wait()
        got.append(get_chat_provider(resolved))

    threads = [threading.Thread(target=ask) for _ in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(got) == 16 and len({id(provider) for provider in got}) == 1
    assert get_chat_provider(resolve_model("gpt-4.1-mini")) is not got[0]  # another provider, its own client


def test_a_forked_child_builds_its_own_client_and_the_parent_keeps_its():
    """A provider client's pooled connections are never shared across a fork (a prefork worker's children)."""
    import os

    from llm.providers import one_per_process

    builds = []

    @one_per_process
    def client(name):
        builds.append(os.getpid())
        return object()

    parent = client("p")
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: a client of its own, built once however often it asks
        os.close(read)
        mine = client("p")
        os.write(write, b"1" if mine is not parent and client("p") is mine and len(builds) == 2 else b"0")
        os._exit(0)
    os.close(write)
    answer = os.read(read, 1)
    os.waitpid(pid, 0)
    assert answer == b"1"
    assert client("p") is parent and builds == [os.getpid()]


# ---------------------------------------------------------------------------------------- shapes


def test_request_and_response_shapes():
    spec = ToolSpec("knowledge_search", "Search.", {"type": "object", "properties": {"query": {"type": "string"}}})
    assert spec.as_openai() == {"type": "function", "function": {
        "name": "knowledge_search", "description": "Search.", "parameters": spec.parameters}}
    request = ChatRequest(model="m", messages=[], tools=[spec])
    assert request.tools == (spec,) and request.cacheable()
    assert not ChatRequest(model="m", messages=[], temperature=0.7).cacheable()

    call = ToolCall(id="call_1", name="knowledge_search", arguments={"query": "x"}, raw='{"query": "x"}')
    response = ChatResponse(content="", tool_calls=(call,), finish_reason="tool_calls", latency_ms=12.5,
                            usage=Usage.priced(provider="openai", model="gpt-4.1-mini", input_tokens=1000,
                                               output_tokens=10))
    assert response.assistant_message() == {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "knowledge_search", "arguments": '{"query": "x"}'}}]}
    assert ChatResponse(content="hi").assistant_message() == {"role": "assistant", "content": "hi"}
    # a JSON round trip (durable checkpoints, the Postgres cache) gives the same response
    assert ChatResponse.from_dict(json.loads(json.dumps(response.as_dict()))) == response
    assert response.usage.usd_cost == Decimal("0.000416")


def test_cache_key_covers_what_decides_the_answer(offline_mode):
    base = ChatRequest(model="gpt-4.1-mini", messages=MESSAGES)
    key = base.cache_key()
    assert len(key) == 64 and key == ChatRequest(model="gpt-4.1-mini", messages=json.loads(json.dumps(MESSAGES))
                                                 ).cache_key()
    # offline, both names reach the same model: the same answer, the same key
    assert ChatRequest(model="gpt-4o", messages=MESSAGES).cache_key() == key
    others = [
        ChatRequest(model="gpt-4.1-mini", messages=MESSAGES[1:]),
        ChatRequest(model="gpt-4.1-mini", messages=MESSAGES, tools=(ToolSpec("t", "", {}),)),
        ChatRequest(model="gpt-4.1-mini", messages=MESSAGES, response_format={"type": "json_object"}),
        ChatRequest(model="gpt-4.1-mini", messages=MESSAGES, max_tokens=10),
        ChatRequest(model="gpt-4.1-mini", messages=MESSAGES, temperature=0.5),
    ]
    assert len({key, *(request.cache_key() for request in others)}) == 6
    offline_mode.LLM_PROVIDER = "openai"
    offline_mode.OPENAI_API_KEY = "sk"
    assert base.cache_key() != key  # a real model answers now


# ----------------------------------------------------------------------------------------- cache


class MemoryCache:
    def __init__(self):
        self.rows: dict[str, dict] = {}
        self.gets = 0

    def get(self, key):
        self.gets += 1
        return self.rows.get(key)

    def put(self, key, request, response):
        self.rows[key] = response.as_dict()


def test_a_cache_hit_answers_without_calling_or_recording(offline_mode):
    cache = MemoryCache()
    request = ChatRequest(model="gpt-4.1-mini", messages=MESSAGES)
    with usage_meter() as meter:
        first, cached = chat(request, cache=cache)
    assert not cached and first.content == "Lineage keeps every version."
    assert first.usage.provider == "offline" and first.usage.model == "offline-directive-v1"
    assert list(cache.rows) == [request.cache_key()] and meter.total.calls == 1

    with usage_meter() as meter:
        again, cached = chat(request, cache=cache)
    assert cached and again == first  # the original usage, so callers see what it would have cost
    assert meter.records == []


def test_a_request_at_a_higher_temperature_skips_the_cache(offline_mode):
    cache = MemoryCache()
    request = ChatRequest(model="gpt-4.1-mini", messages=MESSAGES, temperature=0.7)
    with usage_meter() as meter:
        assert chat(request, cache=cache)[1] is False
        assert chat(request, cache=cache)[1] is False
    assert cache.gets == 0 and cache.rows == {} and meter.total.calls == 2


def test_an_unknown_model_fails_before_the_cache(online_mode):
    cache = MemoryCache()
    with pytest.raises(UnknownModel):
        chat(ChatRequest(model="acme#x", messages=MESSAGES), cache=cache)
    assert cache.gets == 0


# --------------------------------------------------------------------------------------- retries


class ScriptedProvider(ChatProvider):
    name = "scripted"

    def __init__(self, outcomes):
        self.outcomes = list(outcomes)
        self.calls = 0

    def complete(self, request, resolved):
        self.calls += 1
        outcome = self.outcomes.pop(0)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome


@pytest.fixture
def scripted(settings, monkeypatch):
    settings.LLM_PROVIDER = "offline"
    settings.LLM_MAX_RETRIES = 3
    settings.LLM_RETRY_BACKOFF_SECONDS = 1.0
    settings.LLM_RETRY_BACKOFF_CAP_SECONDS = 3.0
    sleeps: list[float] = []
    monkeypatch.setattr(retry, "_sleep", sleeps.append)

    def install(*outcomes):
        provider = ScriptedProvider(outcomes)
        monkeypatch.setattr(chat_module, "get_chat_provider", lambda resolved: provider)
        return provider

    install.sleeps = sleeps
    return install


def test_transient_errors_are_retried_with_capped_exponential_backoff(scripted):
    answer = ChatResponse(content="done", usage=Usage.priced(provider="x", model="gpt-4.1-mini", input_tokens=5))
    provider = scripted(TransientChatError("timeout"), TransientChatError("timeout"),
                        TransientChatError("rate limited", retry_after=60), answer)
    with usage_meter() as meter:
        response, cached = chat(ChatRequest(model="gpt-4.1-mini", messages=MESSAGES))
    assert (response, cached, provider.calls) == (answer, False, 4)
    first, second, third = scripted.sleeps
    assert 0.5 <= first <= 1.0 and 1.0 <= second <= 2.0  # 1s then 2s, each with jitter down to half
    assert third == 3.0  # the server asked for 60s: capped
    assert meter.records == [answer.usage]  # one answer, one record


def test_the_waits_between_retries_go_through_the_callers_wait(scripted):
    answer = ChatResponse(content="done", usage=Usage.priced(provider="x", model="gpt-4.1-mini", input_tokens=5))
    scripted(TransientChatError("rate limited", retry_after=2), answer)
    waits: list[float] = []
    response, _ = chat(ChatRequest(model="gpt-4.1-mini", messages=MESSAGES), wait=waits.append)
    assert response == answer and waits == [2.0] and scripted.sleeps == []


def test_retries_run_out_with_a_transient_error(scripted):
    provider = scripted(*[TransientChatError("still overloaded")] * 4)
    with pytest.raises(TransientChatError, match="failed after 4 attempts: still overloaded"):
        chat(ChatRequest(model="gpt-4.1-mini", messages=MESSAGES))
    assert provider.calls == 4 and len(scripted.sleeps) == 3


def test_permanent_errors_are_not_retried(scripted):
    provider = scripted(ChatError("bad request"))
    with pytest.raises(ChatError, match="bad request"):
        chat(ChatRequest(model="gpt-4.1-mini", messages=MESSAGES))
    assert provider.calls == 1 and scripted.sleeps == []


# ------------------------------------------------------------------------------ text Postgres refuses


@pytest.fixture
def local_server(settings, openai_server):
    """Online settings with OPENAI_BASE_URL on the local OpenAI-compatible server (tests/openai_server.py)."""
    settings.LLM_PROVIDER = "openai"
    settings.OPENAI_API_KEY = "sk-test"
    settings.OPENAI_BASE_URL = openai_server.url("/v1")
    settings.LLM_PROVIDERS = {}
    return openai_server


def _has_bad_text(value) -> bool:
    """Whether `value` holds a string Postgres cannot store: a NUL or a code point that is half a surrogate pair."""
    if isinstance(value, str):
        return "\x00" in value or any("\ud800" <= c <= "\udfff" for c in value)
    if isinstance(value, dict):
        return any(_has_bad_text(k) or _has_bad_text(v) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return any(_has_bad_text(item) for item in value)
    return False


def test_a_providers_nul_characters_and_lone_surrogates_are_cleaned(local_server):
    """Models emit U+0000 and unpaired surrogates; Postgres text and jsonb refuse both. Every response
    chat() returns (and caches) has NULs removed and lone surrogates replaced with U+FFFD."""
    local_server.chat_replies = [
        {"content": "Paris\x00 is the\ud800 capital.", "model": "gpt-x\x00"},
        {"tool_calls": [
            # arguments escaped in the JSON text: the parsed values hold the characters, the raw text does not
            ("call_\x001", "look\ud800up", '{"term": "a\\u0000b\\ud800", "k\\u0000": ["x\\udc00y", {"z\\u0000": 1}]}'),
            # the characters in the raw text itself (not a JSON object then: the arguments are {})
            ("call_2", "lookup", '{"term": "a\x00b"}\ud83d'),
        ]},
    ]
    cache = MemoryCache()
    with usage_meter() as meter:
        answer, cached = chat(ChatRequest(model="gpt-4.1-mini", messages=MESSAGES), cache=cache)
    assert not cached
    assert answer.content == "Paris is the\ufffd capital."
    assert answer.usage.model == "gpt-x" and meter.total.model == "gpt-x"
    assert not _has_bad_text(list(cache.rows.values()))
    assert chat(ChatRequest(model="gpt-4.1-mini", messages=MESSAGES), cache=cache) == (answer, True)

    calls, _ = chat(ChatRequest(model="gpt-4.1-mini", messages=MESSAGES[1:]))
    first, second = calls.tool_calls
    assert (first.id, first.name) == ("call_1", "look\ufffdup")
    assert first.arguments == {"term": "ab\ufffd", "k": ["x\ufffdy", {"z": 1}]}
    assert first.raw == '{"term": "a\\u0000b\\ud800", "k\\u0000": ["x\\udc00y", {"z\\u0000": 1}]}'
    assert (second.arguments, second.raw) == ({}, '{"term": "ab"}\ufffd')
    assert not _has_bad_text(calls.as_dict()) and not _has_bad_text(calls.assistant_message())


def test_cleaning_keeps_surrogate_pairs_and_clean_text_as_it_is():
    from llm.chat import clean_response, clean_text

    assert clean_text("\ud83d\ude00 ok") == "\U0001F600 ok"  # a pair written as two code points: its character
    assert clean_text("\udc00\ud800x\x00") == "\ufffd\ufffdx"
    response = ChatResponse(content="Zürich 🏔", tool_calls=(ToolCall("c", "t", {"a": [1, None, True]}, "{}"),))
    assert clean_response(response) == response


def test_structured_output_format_follows_the_providers_flag(online_mode):
    open_schema = {"type": "object", "properties": {"answer": {"type": "string"}}}
    assert structured_output_format("gpt-4.1-mini", open_schema) == {"type": "json_schema", "json_schema": {
        "name": "output", "schema": open_schema, "strict": False}}  # strict mode would refuse an open object
    assert structured_output_format("openrouter#openai/gpt-4.1-mini", open_schema) is None  # flag off by default
    assert structured_output_format("gpt-4.1-mini", {}) is None
    assert structured_output_format("offline-directive-v1", open_schema) is None

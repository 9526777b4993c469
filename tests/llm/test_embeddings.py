"""Embedding providers: the offline hasher, and OpenAI through the real `openai` client talking
HTTP to a local OpenAI-compatible server (the `openai_server` fixture, tests/llm/conftest.py)."""

from decimal import Decimal

import numpy as np
import pytest
from django.core.exceptions import ImproperlyConfigured

from llm.embeddings import (
    EmbeddingError,
    OfflineEmbeddingProvider,
    OpenAIEmbeddingProvider,
    TransientEmbeddingError,
    WordLlamaEmbeddingProvider,
    get_embedding_provider,
)
from llm.retry import RetryPolicy
from llm.usage import usage_meter
from tests.openai_server import FakeOpenAI


def test_offline_vectors_are_deterministic_unit_length_and_of_the_configured_width():
    provider = OfflineEmbeddingProvider(dimensions=384)
    first = provider.embed(["Durable workflows survive crashes.", "Cats sleep a lot."]).vectors
    again = OfflineEmbeddingProvider(dimensions=384).embed(["Durable workflows survive crashes."]).vectors
    assert first.shape == (2, 384) and first.dtype == np.float32
    assert np.allclose(np.linalg.norm(first, axis=1), 1.0, atol=1e-5)
    assert np.array_equal(first[0], again[0])  # a fresh instance (another process) agrees


def test_offline_vectors_put_related_texts_closer():
    provider = OfflineEmbeddingProvider(dimensions=384)
    query, near, far = provider.embed([
        "how does the durable engine recover a crashed workflow",
        "the durable engine replays a workflow from its checkpoints after a crash",
        "a recipe for lemon cake with butter and sugar",
    ]).vectors
    assert float(query @ near) > float(query @ far) + 0.1


def test_offline_vectors_never_zero_even_for_punctuation_or_empty_text():
    vectors = OfflineEmbeddingProvider(dimensions=64).embed(["", "!!!", "the of and"]).vectors
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)


def test_offline_usage_is_recorded_at_zero_cost():
    with usage_meter() as meter:
        OfflineEmbeddingProvider(dimensions=32).embed(["one two three four", "five"])
    assert meter.total.calls == 1
    assert meter.total.input_tokens > 0
    assert meter.total.usd_cost == Decimal(0)


def test_default_provider_is_offline_without_a_key(settings):
    settings.EMBEDDING_PROVIDER = "offline"
    provider = get_embedding_provider()
    assert provider.name == "offline"
    assert provider.dimensions == settings.EMBEDDING_DIMENSIONS
    # the installation's default offline model is the real local one
    assert isinstance(provider, WordLlamaEmbeddingProvider) and provider.model == "wordllama-l2-supercat"


def test_wordllama_is_semantic_where_the_hasher_is_lexical():
    """Texts about the same thing in other words: the local model puts them together, the hasher cannot."""
    query, near, far = ("a kitten naps on the rug", "the cat sleeps on a mat", "quarterly stock market results")
    model = WordLlamaEmbeddingProvider(dimensions=256).embed([query, near, far]).vectors
    assert model.shape == (3, 256) and model.dtype == np.float32
    assert np.allclose(np.linalg.norm(model, axis=1), 1.0, atol=1e-5)
    assert float(model[0] @ model[1]) > float(model[0] @ model[2]) + 0.2
    hashed = OfflineEmbeddingProvider(dimensions=256).embed([query, near, far]).vectors
    assert abs(float(hashed[0] @ hashed[1])) < 0.1  # no word in common: nothing to go on


def test_wordllama_is_deterministic_truncatable_and_never_zero():
    first = WordLlamaEmbeddingProvider(dimensions=128).embed(["durable workflows survive crashes", "", "!!!"])
    again = WordLlamaEmbeddingProvider(dimensions=128).embed(["durable workflows survive crashes"])
    assert first.vectors.shape == (3, 128) and np.array_equal(first.vectors[0], again.vectors[0])
    assert np.isfinite(first.vectors).all()
    assert np.allclose(np.linalg.norm(first.vectors, axis=1), 1.0, atol=1e-5)
    assert first.usage.usd_cost == Decimal(0) and first.usage.model == "wordllama-l2-supercat"
    with pytest.raises(ImproperlyConfigured, match="64, 128 or 256"):
        WordLlamaEmbeddingProvider(dimensions=384)


def test_wordllama_loads_with_no_network(monkeypatch):
    """Its weights and tokenizer ship in the wheel: loading never opens a connection."""
    import socket

    def refuse(*args, **kwargs):
        raise AssertionError("the local embedding model tried to reach the network")

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    vector = WordLlamaEmbeddingProvider(dimensions=256).embed_query("what is a durable run?")
    assert vector.shape == (256,)


def _provider(server, **kwargs):
    kwargs.setdefault("model", "text-embedding-3-small")
    kwargs.setdefault("dimensions", 384)
    return OpenAIEmbeddingProvider(api_key="sk-test", base_url=server.url("/v1"), timeout=5, **kwargs)


def test_openai_embeddings_through_the_real_client(openai_server):
    provider = _provider(openai_server, batch_size=2)
    with usage_meter() as meter:
        result = provider.embed(["alpha beta", "gamma", "delta epsilon zeta", "eta", "theta"])
    assert result.vectors.shape == (5, 384)
    assert np.allclose(np.linalg.norm(result.vectors, axis=1), 1.0, atol=1e-5)
    # batched: 5 texts in requests of at most 2
    assert [len(p["input"]) for p in openai_server.payloads] == [2, 2, 1]
    first = openai_server.payloads[0]
    assert first["model"] == "text-embedding-3-small" and first["dimensions"] == 384
    assert openai_server.requests[0]["headers"]["authorization"] == "Bearer sk-test"
    # usage from the server's answers, priced from the table (0.02 USD per million tokens)
    assert meter.total.input_tokens == 8
    assert meter.total.usd_cost == Decimal("0.00000016")
    assert result.usage.calls == 3


def test_openai_vectors_keep_the_order_of_the_texts(openai_server):
    provider = _provider(openai_server)
    texts = ["one", "two", "three"]
    together = provider.embed(texts).vectors
    alone = np.stack([provider.embed_query(t) for t in texts])
    assert np.allclose(together, alone, atol=1e-6)


@pytest.fixture
def sleeps(monkeypatch):
    from llm import retry

    waited: list[float] = []
    monkeypatch.setattr(retry, "_sleep", waited.append)
    return waited


def test_openai_rate_limit_is_retried_with_retry_after(openai_server, sleeps):
    openai_server.failures = [
        (429, {"Content-Type": "application/json", "Retry-After": "2"},
         '{"error": {"message": "Rate limit reached", "type": "requests"}}'),
        (503, {"Content-Type": "application/json"}, '{"error": {"message": "overloaded"}}'),
    ]
    provider = _provider(openai_server, retry=RetryPolicy(max_retries=5, backoff_seconds=0.5, cap_seconds=30))
    vectors = provider.embed(["retry me"]).vectors
    assert vectors.shape == (1, 384)
    assert sleeps[0] == 2.0  # the server's Retry-After
    assert 0.25 <= sleeps[1] <= 1.0  # exponential backoff with jitter, second attempt
    assert len(openai_server.requests) == 3


def test_openai_gives_up_after_max_retries_with_a_transient_error(openai_server, sleeps):
    openai_server.failures = [(429, {"Content-Type": "application/json"}, '{"error": {"message": "slow down"}}')] * 3
    provider = _provider(openai_server, retry=RetryPolicy(max_retries=2, backoff_seconds=0, cap_seconds=0))
    with pytest.raises(TransientEmbeddingError, match="after 3 attempts"):
        provider.embed(["x"])


def test_openai_bad_request_fails_at_once_with_the_server_message(openai_server, sleeps):
    openai_server.failures = [(400, {"Content-Type": "application/json"},
                               '{"error": {"message": "This model does not exist", "type": "invalid_request"}}')]
    provider = _provider(openai_server)
    with pytest.raises(EmbeddingError, match="This model does not exist") as caught:
        provider.embed(["x"])
    assert not isinstance(caught.value, TransientEmbeddingError)
    assert sleeps == []


def test_openai_model_of_another_width_is_a_clear_error():
    with FakeOpenAI(native_dimensions=768) as server:
        provider = _provider(server, model="nomic-embed-text")
        with pytest.raises(EmbeddingError, match="768-dimensional vectors but EMBEDDING_DIMENSIONS is 384"):
            provider.embed(["x"])
        assert "dimensions" not in server.payloads[0]  # only text-embedding-3 models are asked to shorten


def test_openai_provider_from_settings_uses_the_base_url(settings, openai_server):
    settings.EMBEDDING_PROVIDER = "openai"
    settings.EMBEDDING_MODEL = "text-embedding-3-small"
    settings.EMBEDDING_DIMENSIONS = 384
    settings.OPENAI_API_KEY = "sk-settings"
    settings.OPENAI_BASE_URL = openai_server.url("/v1")
    provider = get_embedding_provider()
    assert provider.name == "openai"
    assert provider.embed_query("hello").shape == (384,)
    assert openai_server.requests[-1]["headers"]["authorization"] == "Bearer sk-settings"


def test_offline_v2_vector_of_a_text_does_not_depend_on_its_batch():
    provider = OfflineEmbeddingProvider(dimensions=128)
    texts = ["Durable workflows survive crashes.", "", "!!!", "the of and", "Ünïcödé wörds\u00a0and\ttabs, again"]
    together = provider.embed(texts).vectors
    for i, text in enumerate(texts):
        assert np.array_equal(provider.embed([text]).vectors[0], together[i])
    # whitespace of any kind and punctuation separate words alike
    a, b = provider.embed(["hello,  world\u00a0again", "Hello world again"]).vectors
    assert np.allclose(a, b)


def test_offline_v1_is_kept_for_stored_vectors_and_differs_from_v2():
    v1 = OfflineEmbeddingProvider(dimensions=64, model="offline-hash-v1").embed(["durable workflows"]).vectors
    v2 = OfflineEmbeddingProvider(dimensions=64).embed(["durable workflows"]).vectors
    assert OfflineEmbeddingProvider(dimensions=64).model == "offline-hash-v2"
    assert not np.allclose(v1, v2)
    assert np.array_equal(v1, OfflineEmbeddingProvider(dimensions=64, model="offline-hash-v1")
                          .embed(["durable workflows"]).vectors)


def test_openai_embeddings_follow_the_one_retry_policy(settings, openai_server, sleeps):
    """Embeddings wait as chat calls do: the server's retry-after-ms, and LLM_MAX_RETRIES retries at most."""
    settings.EMBEDDING_PROVIDER = "openai"
    settings.EMBEDDING_MODEL = "text-embedding-3-small"
    settings.OPENAI_API_KEY = "sk-settings"
    settings.OPENAI_BASE_URL = openai_server.url("/v1")
    settings.LLM_MAX_RETRIES = 1
    openai_server.failures = [(429, {"Content-Type": "application/json", "retry-after-ms": "1500"},
                               '{"error": {"message": "slow down"}}')] * 3
    with pytest.raises(TransientEmbeddingError, match="after 2 attempts"):
        get_embedding_provider().embed(["x"])
    assert sleeps == [1.5]
    assert len(openai_server.requests) == 2


def test_embeddings_from_any_configured_provider(settings, monkeypatch):
    """An Ollama (or vLLM, LM Studio) embedding model: EMBEDDING_PROVIDER names an LLM_PROVIDERS entry."""
    with FakeOpenAI(native_dimensions=768) as server:
        settings.LLM_PROVIDERS = {"ollama": {"base_url": server.url("/v1"), "api_key_env": None}}
        settings.EMBEDDING_PROVIDER = "ollama"
        settings.EMBEDDING_MODEL = "nomic-embed-text"
        settings.EMBEDDING_DIMENSIONS = 768
        with usage_meter() as meter:
            vectors = get_embedding_provider().embed(["alpha", "beta"]).vectors
        assert vectors.shape == (2, 768)
        assert server.payloads[0]["model"] == "nomic-embed-text" and "dimensions" not in server.payloads[0]
        assert meter.total.provider == "ollama"
        settings.LLM_PROVIDERS = {"router": {"base_url": server.url("/v1"), "api_key_env": "ROUTER_KEY"}}
        settings.EMBEDDING_PROVIDER = "router"
        monkeypatch.delenv("ROUTER_KEY", raising=False)
        with pytest.raises(ImproperlyConfigured, match="set ROUTER_KEY"):
            get_embedding_provider()

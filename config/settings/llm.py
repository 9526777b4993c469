"""LLM and embedding providers. Without OPENAI_API_KEY the deterministic offline provider answers."""

import json
import re
from urllib.parse import urlsplit

from django.core.exceptions import ImproperlyConfigured

from config.env import env_bool, env_float, env_int, env_list, env_str, env_url

OPENAI_API_KEY = env_str("OPENAI_API_KEY", "")
OPENAI_BASE_URL = env_url("OPENAI_BASE_URL", None, schemes=("http", "https"))
LLM_PROVIDER = env_str("LLM_PROVIDER", "openai" if OPENAI_API_KEY else "offline")
LLM_DEFAULT_MODEL = env_str("LLM_DEFAULT_MODEL", "gpt-4.1-mini")
if LLM_PROVIDER not in ("openai", "offline"):
    raise ImproperlyConfigured(f"LLM_PROVIDER={LLM_PROVIDER!r} is not known: use 'openai' or 'offline'.")
LLM_TIMEOUT_SECONDS = env_int("LLM_TIMEOUT_SECONDS", 60, minimum=1)
# Chat calls that hit a rate limit, a timeout, a lost connection or a 5xx answer are retried this many
# times (so 1 + LLM_MAX_RETRIES attempts), waiting the server's Retry-After or else
# LLM_RETRY_BACKOFF_SECONDS * 2**(retry - 1) with jitter, never more than LLM_RETRY_BACKOFF_CAP_SECONDS.
LLM_MAX_RETRIES = env_int("LLM_MAX_RETRIES", 4, minimum=0, maximum=20)
LLM_RETRY_BACKOFF_SECONDS = env_float("LLM_RETRY_BACKOFF_SECONDS", 1.0, minimum=0)
LLM_RETRY_BACKOFF_CAP_SECONDS = env_float("LLM_RETRY_BACKOFF_CAP_SECONDS", 30.0, minimum=0)
# Temperature-0 chat calls are answered from the Postgres cache (workflows.LlmCall) when an identical
# call was made before, so re-evaluating a node never pays twice; False always asks the provider.
LLM_CACHE_ENABLED = env_bool("LLM_CACHE_ENABLED", True)

# OpenAI-compatible providers a workflow's model name may name with a prefix, "<provider>#<model>"
# ("openrouter#openai/gpt-4.1-mini"): each maps to a base URL and the environment variable holding its key
# (leave api_key_env out for a server that needs none, such as a local Ollama or vLLM), e.g.
# LLM_PROVIDERS='{"openrouter": {"base_url": "https://openrouter.ai/api/v1", "api_key_env": "OPENROUTER_API_KEY"}}'
# Built in: "openai" (OPENAI_BASE_URL, OPENAI_API_KEY; an entry of that name replaces it) and "offline" (the
# deterministic offline model, offline-directive-v1). A bare model name uses "openai" when LLM_PROVIDER is
# openai; with LLM_PROVIDER=offline every model of a configured provider is answered offline.
_PROVIDER_NAME = re.compile(r"[a-z0-9][a-z0-9_.-]*")


def _providers(raw: str) -> dict[str, dict]:
    if not raw:
        return {}
    try:
        value = json.loads(raw)
    except ValueError as exc:
        raise ImproperlyConfigured(f"LLM_PROVIDERS is not valid JSON ({exc}).") from None
    if not isinstance(value, dict):
        raise ImproperlyConfigured("LLM_PROVIDERS must be a JSON object: provider name -> {base_url, api_key_env}.")
    providers = {}
    for name, entry in value.items():
        where = f"LLM_PROVIDERS[{name!r}]"
        if not _PROVIDER_NAME.fullmatch(name):
            raise ImproperlyConfigured(f"{where}: a provider name is lower-case letters, digits, '_', '.' or '-'.")
        if name == "offline":
            raise ImproperlyConfigured(f"{where}: 'offline' is the built-in offline model and cannot be replaced.")
        if not isinstance(entry, dict) or set(entry) - {"base_url", "api_key_env"}:
            raise ImproperlyConfigured(f"{where} must be an object with the keys base_url and api_key_env only.")
        base_url = entry.get("base_url")
        if base_url is not None and (not isinstance(base_url, str) or urlsplit(base_url).scheme not in
                                     ("http", "https") or not urlsplit(base_url).netloc):
            raise ImproperlyConfigured(f"{where}: base_url must be an http(s) URL, got {base_url!r}.")
        if base_url is None and name != "openai":
            raise ImproperlyConfigured(f"{where}: base_url is required.")
        key_env = entry.get("api_key_env")
        if key_env is not None and (not isinstance(key_env, str) or not key_env.strip()):
            raise ImproperlyConfigured(f"{where}: api_key_env must name an environment variable.")
        providers[name] = {"base_url": base_url, "api_key_env": key_env}
    return providers


LLM_PROVIDERS = _providers(env_str("LLM_PROVIDERS", ""))

EMBEDDING_PROVIDER = env_str("EMBEDDING_PROVIDER", "openai" if OPENAI_API_KEY else "offline")
EMBEDDING_MODEL = env_str("EMBEDDING_MODEL", "text-embedding-3-small" if OPENAI_API_KEY else "offline-hash-v2")
# The width of every stored vector: the knowledge tables' vector(N) column is created with it.
EMBEDDING_DIMENSIONS = env_int("EMBEDDING_DIMENSIONS", 384, minimum=8, maximum=2000)
EMBEDDING_BATCH_SIZE = env_int("EMBEDDING_BATCH_SIZE", 64, minimum=1, maximum=2048)

# Prices (USD per million tokens) added to or overriding llm/prices.py, e.g.
# LLM_PRICES='{"my-local-model": {"input": 0, "output": 0}}'
_prices = env_str("LLM_PRICES", "")
try:
    LLM_PRICES = json.loads(_prices) if _prices else {}
    if not isinstance(LLM_PRICES, dict):
        raise ValueError("expected a JSON object")
except ValueError as exc:
    raise ImproperlyConfigured(f"LLM_PRICES is not a valid JSON object ({exc}).") from None

# ---- knowledge base (knowledge/conf.py documents each) ----
KNOWLEDGE_CHUNK_SIZE = env_int("KNOWLEDGE_CHUNK_SIZE", 1400, minimum=200, maximum=20_000)
KNOWLEDGE_CHUNK_OVERLAP = env_int("KNOWLEDGE_CHUNK_OVERLAP", 200, minimum=0, maximum=5_000)
KNOWLEDGE_MAX_CHUNKS_PER_SOURCE = env_int("KNOWLEDGE_MAX_CHUNKS_PER_SOURCE", 20_000, minimum=1)
KNOWLEDGE_UPLOAD_MAX_BYTES = env_int("KNOWLEDGE_UPLOAD_MAX_BYTES", 20 * 1024 * 1024, minimum=1024)
KNOWLEDGE_URL_TIMEOUT_SECONDS = env_int("KNOWLEDGE_URL_TIMEOUT_SECONDS", 15, minimum=1)
KNOWLEDGE_URL_MAX_BYTES = env_int("KNOWLEDGE_URL_MAX_BYTES", 10 * 1024 * 1024, minimum=1024)
# private networks a URL source may still reach (an intranet wiki), e.g. "10.20.0.0/16"; empty: public only
KNOWLEDGE_URL_ALLOWED_NETWORKS = env_list("KNOWLEDGE_URL_ALLOWED_NETWORKS", [])
KNOWLEDGE_EXACT_SCAN_MAX_ROWS = env_int("KNOWLEDGE_EXACT_SCAN_MAX_ROWS", 5_000, minimum=0)
KNOWLEDGE_HNSW_EF_SEARCH = env_int("KNOWLEDGE_HNSW_EF_SEARCH", 400, minimum=10, maximum=1000)
KNOWLEDGE_INGEST_BATCH_CHUNKS = env_int("KNOWLEDGE_INGEST_BATCH_CHUNKS", 256, minimum=1, maximum=10_000)
KNOWLEDGE_INGEST_QUEUE = env_str("KNOWLEDGE_INGEST_QUEUE", "ingest")

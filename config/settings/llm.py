"""LLM and embedding providers. Without OPENAI_API_KEY the deterministic offline provider answers."""

import json
import re
from urllib.parse import urlsplit

from django.core.exceptions import ImproperlyConfigured

from config.env import env_bool, env_float, env_int, env_list, env_str, env_url

OPENAI_API_KEY = env_str("OPENAI_API_KEY", "")
OPENAI_BASE_URL = env_url("OPENAI_BASE_URL", None, schemes=("http", "https"))
LLM_PROVIDER = env_str("LLM_PROVIDER", "openai" if OPENAI_API_KEY else "offline")
LLM_DEFAULT_MODEL = env_str("LLM_DEFAULT_MODEL", "gpt-4.1-mini").strip()
if LLM_PROVIDER not in ("openai", "offline"):
    raise ImproperlyConfigured(f"LLM_PROVIDER={LLM_PROVIDER!r} is not known: use 'openai' or 'offline'.")
LLM_TIMEOUT_SECONDS = env_int("LLM_TIMEOUT_SECONDS", 60, minimum=1)
# Model calls of durable runs (a node's calls, MCP tool calls) are steps of their own on this Celery queue,
# served by a worker with a threads pool (`make run` starts it: celery worker -Q llm --pool threads
# --concurrency LLM_MAX_IN_FLIGHT), so a provider's latency never holds a turn worker. Calls to the offline
# model stay in the turn: they answer in well under a millisecond.
LLM_QUEUE = env_str("LLM_QUEUE", "llm")
# Model calls one llm worker process keeps in flight (its threads); they share the process's one pool
# of DATABASE_POOL_MAX_SIZE connections, each taken only for the call's reads and writes.
LLM_MAX_IN_FLIGHT = env_int("LLM_MAX_IN_FLIGHT", 64, minimum=1, maximum=1024)
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
# An entry may also say:
#   "structured_outputs": true|false   the server honours response_format json_schema (default: true for
#                                      openai, false for any other), so a node's outputSchema is sent as one
#   "max_concurrency": N               calls in flight to this provider at most (default: no cap)
#   "requests_per_minute": N           calls started per minute at most (default: no limit)
#   "models": {"<model>": {"max_concurrency": N, "requests_per_minute": N}}   the same limits for one model
# (llm/providers.py reads an entry as a typed ProviderConfig; README "Model providers" documents them).
# Built in: "openai" (OPENAI_BASE_URL, OPENAI_API_KEY; an entry of that name replaces it) and "offline" (the
# deterministic offline model, offline-directive-v1). A bare model name uses "openai" when LLM_PROVIDER is
# openai; with LLM_PROVIDER=offline every model name, prefixed or not, is answered offline.
_PROVIDER_NAME = re.compile(r"[a-z0-9][a-z0-9_.-]*")
_PROVIDER_KEYS = {"base_url", "api_key_env", "structured_outputs", "max_concurrency", "requests_per_minute", "models"}
_LIMIT_KEYS = ("max_concurrency", "requests_per_minute")


def _limits(entry: dict, where: str) -> dict:
    limits = {}
    for key in _LIMIT_KEYS:
        value = entry.get(key)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
            raise ImproperlyConfigured(f"{where}: {key} must be a whole number of at least 1, got {value!r}.")
        limits[key] = value
    return limits


def _provider_entry(name: str, entry, where: str) -> dict:
    if not isinstance(entry, dict) or set(entry) - _PROVIDER_KEYS:
        unknown = ", ".join(sorted(set(entry) - _PROVIDER_KEYS)) if isinstance(entry, dict) else "not an object"
        raise ImproperlyConfigured(f"{where} must be an object with the keys {', '.join(sorted(_PROVIDER_KEYS))} "
                                   f"only ({unknown}).")
    base_url = entry.get("base_url")
    if base_url is not None and (not isinstance(base_url, str) or urlsplit(base_url).scheme not in
                                 ("http", "https") or not urlsplit(base_url).netloc):
        raise ImproperlyConfigured(f"{where}: base_url must be an http(s) URL, got {base_url!r}.")
    if base_url is None and name != "openai":
        raise ImproperlyConfigured(f"{where}: base_url is required.")
    key_env = entry.get("api_key_env")
    if key_env is not None and (not isinstance(key_env, str) or not key_env.strip()):
        raise ImproperlyConfigured(f"{where}: api_key_env must name an environment variable.")
    structured = entry.get("structured_outputs", name == "openai")
    if not isinstance(structured, bool):
        raise ImproperlyConfigured(f"{where}: structured_outputs must be true or false, got {structured!r}.")
    models = entry.get("models") or {}
    if not isinstance(models, dict):
        raise ImproperlyConfigured(f"{where}: models must be an object: model name -> its limits.")
    model_limits = {}
    for model, limits in models.items():
        at = f"{where}['models'][{model!r}]"
        if not isinstance(limits, dict) or set(limits) - set(_LIMIT_KEYS):
            raise ImproperlyConfigured(f"{at} must be an object with the keys {' and '.join(_LIMIT_KEYS)} only.")
        model_limits[model] = _limits(limits, at)
    return {"base_url": base_url, "api_key_env": key_env, "structured_outputs": structured,
            **_limits(entry, where), "models": model_limits}


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
        providers[name] = _provider_entry(name, entry, where)
    return providers


def _json_object(name: str, check) -> dict:
    """The environment variable `name` as a JSON object whose entries pass `check(key, value) -> error | None`."""
    raw = env_str(name, "")
    if not raw:
        return {}
    try:
        value = json.loads(raw)
    except ValueError as exc:
        raise ImproperlyConfigured(f"{name} is not valid JSON ({exc}).") from None
    if not isinstance(value, dict):
        raise ImproperlyConfigured(f"{name} must be a JSON object.")
    for key, item in value.items():
        problem = check(key, item)
        if problem:
            raise ImproperlyConfigured(f"{name}[{key!r}]: {problem}.")
    return value


LLM_PROVIDERS = _providers(env_str("LLM_PROVIDERS", ""))
# One default model, used wherever a model is not named: the canonical agents' tiers, the evolution
# operators' model pool, the LLM judge, the demo workflows. On its own default (OpenAI's gpt-4.1-mini) the
# tiers and the pool are OpenAI's family; set to another model (say "ollama#llama3.2"), every one of them
# is that model unless LLM_MODEL_TIERS / EVOLUTION_MODELS say otherwise.
_OPENAI_FAMILY = LLM_DEFAULT_MODEL == "gpt-4.1-mini"


def _model_name(key, value) -> str | None:
    return None if isinstance(value, str) and value.strip() else "must be a model name"


# the canonical agents' model classes (evals/agents/*.yaml `tier:`), e.g.
# LLM_MODEL_TIERS='{"haiku": "ollama#llama3.2", "sonnet": "ollama#qwen2.5:14b"}'; a tier left out gets its default
LLM_MODEL_TIERS = {
    **({"haiku": "gpt-4.1-nano", "sonnet": "gpt-4.1-mini"} if _OPENAI_FAMILY
       else {"haiku": LLM_DEFAULT_MODEL, "sonnet": LLM_DEFAULT_MODEL}),
    **{tier: model.strip() for tier, model in _json_object("LLM_MODEL_TIERS", _model_name).items()},
}
# the models the evolution operators' "model" mutation chooses among (comma-separated)
EVOLUTION_MODELS = env_list("EVOLUTION_MODELS", ["gpt-4.1-mini", "gpt-4.1-nano", "gpt-4o-mini"] if _OPENAI_FAMILY
                            else list(dict.fromkeys([LLM_DEFAULT_MODEL, *LLM_MODEL_TIERS.values()])))


def _model_options(pattern, value) -> str | None:
    if not isinstance(value, dict) or set(value) - {"token_limit_param", "temperature", "extra_body"}:
        return "must be an object with the keys token_limit_param, temperature and extra_body only"
    if value.get("token_limit_param", "max_tokens") not in ("max_tokens", "max_completion_tokens"):
        return "token_limit_param must be max_tokens or max_completion_tokens"
    if not isinstance(value.get("temperature", True), bool):
        return "temperature must be true (the model takes one) or false"
    if not isinstance(value.get("extra_body", {}), dict):
        return "extra_body must be an object"
    return None


# request options per model, over the built-in table of llm/model_options.py (reasoning models take
# max_completion_tokens and no temperature); keys are shell-style patterns of the model name, e.g.
# LLM_MODEL_OPTIONS='{"deepseek-r1*": {"temperature": false}, "qwen3*": {"extra_body": {"reasoning_effort": "low"}}}'
LLM_MODEL_OPTIONS = _json_object("LLM_MODEL_OPTIONS", _model_options)

# Embeddings: "offline" (on this machine, no key), "openai" (OPENAI_BASE_URL, OPENAI_API_KEY) or any
# LLM_PROVIDERS entry (an Ollama embedding model: EMBEDDING_PROVIDER=ollama EMBEDDING_MODEL=nomic-embed-text
# EMBEDDING_DIMENSIONS=768). Offline models: "wordllama-l2-supercat" (the default: a real static embedding
# model whose weights ship in the wordllama wheel; 64, 128 or 256 dimensions) and the feature hashers
# "offline-hash-v2" / "offline-hash-v1" (lexical, any width; the benchmark corpus uses them).
EMBEDDING_PROVIDER = env_str("EMBEDDING_PROVIDER", "openai" if OPENAI_API_KEY else "offline").strip().lower()
if EMBEDDING_PROVIDER not in ("openai", "offline", *LLM_PROVIDERS):
    raise ImproperlyConfigured(f"EMBEDDING_PROVIDER={EMBEDDING_PROVIDER!r} is not known: use 'offline', 'openai' or "
                               f"a provider of LLM_PROVIDERS ({', '.join(sorted(LLM_PROVIDERS)) or 'none'}).")
# a provider of LLM_PROVIDERS has no default model: EMBEDDING_MODEL is then required (refused by name when unset)
_EMBEDDING_DEFAULTS = {"openai": "text-embedding-3-small", "offline": "wordllama-l2-supercat"}
EMBEDDING_MODEL = (env_str("EMBEDDING_MODEL", _EMBEDDING_DEFAULTS[EMBEDDING_PROVIDER])
                   if EMBEDDING_PROVIDER in _EMBEDDING_DEFAULTS else env_str("EMBEDDING_MODEL"))
# The width of every stored vector: the knowledge tables' vector(N) column is created with it; a column of
# another width is refused at start (`manage.py knowledge reembed` moves the stored vectors to the new width).
EMBEDDING_DIMENSIONS = env_int("EMBEDDING_DIMENSIONS", 256 if EMBEDDING_MODEL.startswith("wordllama") else 384,
                               minimum=8, maximum=2000)
if EMBEDDING_PROVIDER == "offline" and EMBEDDING_MODEL.startswith("wordllama") and EMBEDDING_DIMENSIONS not in (
        64, 128, 256):
    raise ImproperlyConfigured(f"EMBEDDING_DIMENSIONS={EMBEDDING_DIMENSIONS} is not a width of {EMBEDDING_MODEL}: "
                               "use 64, 128 or 256 (or EMBEDDING_MODEL=offline-hash-v2, which takes any).")
EMBEDDING_BATCH_SIZE = env_int("EMBEDDING_BATCH_SIZE", 64, minimum=1, maximum=2048)


def _price(key, value) -> str | None:
    if not isinstance(value, dict) or set(value) - {"input", "output"}:
        return 'must be an object {"input": <USD per million tokens>, "output": <USD per million tokens>}'
    for side in ("input", "output"):
        amount = value.get(side, 0)
        if not isinstance(amount, (int, float)) or isinstance(amount, bool) or not 0 <= amount < 1e6:
            return f"{side} must be a USD amount per million tokens, got {amount!r}"
    return None


# Prices (USD per million tokens) over the maintained price database (genai-prices): keys are a model
# ("my-model"), a provider's model ("ollama#llama3.2") or every model of a provider ("ollama#*"), e.g.
# LLM_PRICES='{"ollama#*": {"input": 0, "output": 0}}'. A model priced by neither cannot run under a USD budget.
LLM_PRICES = _json_object("LLM_PRICES", _price)

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
KNOWLEDGE_INGEST_RETRIES = 3
KNOWLEDGE_INGEST_BACKOFF_BASE = 2.0
# the index builds of a bulk load (knowledge/bulk.py) run with this much maintenance memory
KNOWLEDGE_BULK_MAINTENANCE_WORK_MEM = "1GB"

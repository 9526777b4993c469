"""LLM and embedding providers. Without OPENAI_API_KEY the deterministic offline provider answers."""

import json

from django.core.exceptions import ImproperlyConfigured

from config.env import env_int, env_str, env_url

OPENAI_API_KEY = env_str("OPENAI_API_KEY", "")
OPENAI_BASE_URL = env_url("OPENAI_BASE_URL", None, schemes=("http", "https"))
LLM_PROVIDER = env_str("LLM_PROVIDER", "openai" if OPENAI_API_KEY else "offline")
LLM_DEFAULT_MODEL = env_str("LLM_DEFAULT_MODEL", "gpt-4.1-mini")
LLM_TIMEOUT_SECONDS = env_int("LLM_TIMEOUT_SECONDS", 60, minimum=1)

EMBEDDING_PROVIDER = env_str("EMBEDDING_PROVIDER", "openai" if OPENAI_API_KEY else "offline")
EMBEDDING_MODEL = env_str("EMBEDDING_MODEL", "text-embedding-3-small" if OPENAI_API_KEY else "offline-hash-v1")
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

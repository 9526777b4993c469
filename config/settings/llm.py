"""LLM and embedding providers. Without OPENAI_API_KEY the deterministic offline provider answers."""

import json

from django.core.exceptions import ImproperlyConfigured

from config.env import env_int, env_list, env_str, env_url

OPENAI_API_KEY = env_str("OPENAI_API_KEY", "")
OPENAI_BASE_URL = env_url("OPENAI_BASE_URL", None, schemes=("http", "https"))
LLM_PROVIDER = env_str("LLM_PROVIDER", "openai" if OPENAI_API_KEY else "offline")
LLM_DEFAULT_MODEL = env_str("LLM_DEFAULT_MODEL", "gpt-4.1-mini")
LLM_TIMEOUT_SECONDS = env_int("LLM_TIMEOUT_SECONDS", 60, minimum=1)

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

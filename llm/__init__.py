"""Model providers shared by every app: embeddings (OpenAI or any OpenAI-compatible server, and a
deterministic offline stand-in), the model price table, and usage accounting. A plain package:
no models, no migrations."""

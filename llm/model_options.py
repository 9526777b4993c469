"""Per-model request options: what a chat request to a given model must look like.

Most OpenAI-compatible models take ``temperature`` and ``max_tokens``. Reasoning models do not:
OpenAI's o-series and the gpt-5 family refuse a temperature and want ``max_completion_tokens``.
The built-in table below says so; ``LLM_MODEL_OPTIONS`` adds entries (or replaces them: the setting
is read first), keyed by shell-style patterns of the model name:

=================== ========================== ============ ==========================
pattern             token_limit_param          temperature  extra_body
=================== ========================== ============ ==========================
``o1*`` ``o3*``     ``max_completion_tokens``  not sent
``o4*`` ``gpt-5*``  ``max_completion_tokens``  not sent
(any other)         ``max_tokens``             sent         none
=================== ========================== ============ ==========================

``extra_body`` is merged into the request as is (a server's own options, e.g. ``reasoning_effort``).
A pattern matches the model name as the provider is asked for it (``openai/gpt-5``), its last path
segment (``gpt-5``), or the name with its provider prefix (``openrouter#openai/gpt-5``); the first
matching entry decides.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from fnmatch import fnmatchcase

from django.conf import settings


@dataclass(frozen=True)
class ModelOptions:
    token_limit_param: str = "max_tokens"  # noqa: S105 (a request field name): or "max_completion_tokens"
    temperature: bool = True  # the model takes a temperature
    extra_body: dict = field(default_factory=dict)  # sent with the request as is


_REASONING = {"token_limit_param": "max_completion_tokens", "temperature": False}
BUILTIN_OPTIONS: dict[str, dict] = {"o1*": _REASONING, "o3*": _REASONING, "o4*": _REASONING, "gpt-5*": _REASONING}


def model_options(provider: str, model: str) -> ModelOptions:
    """The request options of `model` (the name sent to `provider`)."""
    names = (model.casefold(), model.rsplit("/", 1)[-1].casefold(), f"{provider}#{model}".casefold())
    configured = getattr(settings, "LLM_MODEL_OPTIONS", None) or {}
    for pattern, entry in (*configured.items(), *BUILTIN_OPTIONS.items()):
        if any(fnmatchcase(name, pattern.casefold()) for name in names):
            return ModelOptions(token_limit_param=entry.get("token_limit_param", "max_tokens"),
                                temperature=entry.get("temperature", True),
                                extra_body=dict(entry.get("extra_body") or {}))
    return ModelOptions()

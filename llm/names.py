"""Model names as a workflow DSL writes them, and where a call to one goes on this install (the rules are in
llm/chat.py's docstring): the offline model's name, the provider separator, ``resolve_model``."""

from __future__ import annotations

from dataclasses import dataclass

from django.conf import settings

from llm.errors import UnknownModel
from llm.providers import OFFLINE_PROVIDER, configured_providers

OFFLINE_MODEL = "offline-directive-v1"
PROVIDER_SEPARATOR = "#"


@dataclass(frozen=True)
class ResolvedModel:
    provider: str  # "offline", "openai" or a name from LLM_PROVIDERS
    model: str  # the name the provider is asked for (the prefix removed)
    base_url: str | None
    api_key: str


def resolve_model(model_name: str) -> ResolvedModel:
    """Where a call to `model_name` goes on this install (see the module docstring for the rules)."""
    name = (model_name or "").strip()
    if not name:
        raise UnknownModel("The model name is empty.")
    prefix, separator, model = name.partition(PROVIDER_SEPARATOR)
    if not separator:
        prefix, model = "", name
    prefix = prefix.strip().lower()
    model = model.strip()
    if separator and not prefix:
        raise UnknownModel(f"Model {model_name!r} has an empty provider prefix before {PROVIDER_SEPARATOR!r}.")
    if not model:
        raise UnknownModel(f"Model {model_name!r} names no model after {PROVIDER_SEPARATOR!r}.")
    if prefix == OFFLINE_PROVIDER or (not prefix and model == OFFLINE_MODEL):
        return ResolvedModel(OFFLINE_PROVIDER, OFFLINE_MODEL, None, "")
    if settings.LLM_PROVIDER == OFFLINE_PROVIDER:
        # the demo and the tests: every model name, whatever provider it names, is the offline model
        # (its usage says so), so workflows written for real providers run unchanged
        return ResolvedModel(OFFLINE_PROVIDER, OFFLINE_MODEL, None, "")
    providers = configured_providers()
    provider = prefix or "openai"
    if provider not in providers:
        known = ", ".join(sorted(providers))
        raise UnknownModel(f'Model {model_name!r}: provider "{prefix}" is not configured (LLM_PROVIDERS; '
                           f"configured: {known}).")
    config = providers[provider]
    api_key = config.api_key()
    if api_key is None:
        raise UnknownModel(f'Model {model_name!r}: provider "{provider}" has no API key '
                           f"(set {config.api_key_env}).")
    return ResolvedModel(provider, model, config.url(), api_key)

"""The configured model providers as typed records: where a provider is, its key, whether it honours
structured outputs, and the limits an operator set on it (``LLM_PROVIDERS``, config/settings/llm.py).

    config = provider_config("openrouter")       # ProviderConfig or None
    provider_limits("openrouter", "openai/gpt-4.1-mini")   # ProviderLimits(max_concurrency=8, ...)

Built in: ``openai`` (``OPENAI_BASE_URL``, ``OPENAI_API_KEY``; an entry of that name replaces it) and
``offline`` (the deterministic offline model). Limits are read here; they are enforced where model
calls are scheduled, not by this module.
"""

from __future__ import annotations

import functools
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from django.conf import settings

OFFLINE_PROVIDER = "offline"


@dataclass(frozen=True)
class ProviderLimits:
    max_concurrency: int | None = None  # calls in flight at most; None: no cap
    requests_per_minute: int | None = None  # calls started per minute at most; None: no limit

    def over(self, base: ProviderLimits) -> ProviderLimits:
        """These limits where set, else `base`'s."""
        return ProviderLimits(
            max_concurrency=self.max_concurrency if self.max_concurrency is not None else base.max_concurrency,
            requests_per_minute=self.requests_per_minute if self.requests_per_minute is not None
            else base.requests_per_minute)


@dataclass(frozen=True)
class ProviderConfig:
    name: str
    base_url: str | None  # None: the openai client's default (api.openai.com)
    api_key_env: str | None  # the environment variable holding the key; None: the server needs none
    structured_outputs: bool  # response_format json_schema is honoured
    limits: ProviderLimits = field(default_factory=ProviderLimits)
    model_limits: dict[str, ProviderLimits] = field(default_factory=dict)

    def limits_for(self, model: str) -> ProviderLimits:
        """The limits of calls to `model` (the name the provider is asked for): its own, else the provider's."""
        own = self.model_limits.get(model)
        return own.over(self.limits) if own else self.limits

    def api_key(self) -> str | None:
        """The key from the environment variable the entry names (OPENAI_API_KEY through its setting);
        "" when it names none (a local server); None when that variable is unset. The built-in openai
        provider pointed at another server (OPENAI_BASE_URL) may go without a key."""
        if not self.api_key_env:
            return ""
        name = self.api_key_env
        value = settings.OPENAI_API_KEY if name == "OPENAI_API_KEY" else os.environ.get(name, "")
        if not value.strip() and self.name == "openai" and settings.OPENAI_BASE_URL:
            return ""
        return value.strip() or None

    def url(self) -> str | None:
        """The base URL calls go to (the built-in openai: OPENAI_BASE_URL)."""
        if self.name == "openai" and self.base_url is None:
            return settings.OPENAI_BASE_URL
        return self.base_url


def _limits(entry: dict) -> ProviderLimits:
    return ProviderLimits(max_concurrency=entry.get("max_concurrency"),
                          requests_per_minute=entry.get("requests_per_minute"))


def _config(name: str, entry: dict) -> ProviderConfig:
    return ProviderConfig(
        name=name, base_url=entry.get("base_url"), api_key_env=entry.get("api_key_env"),
        structured_outputs=bool(entry.get("structured_outputs", name == "openai")),
        limits=_limits(entry), model_limits={model: _limits(limits) for model, limits in
                                             (entry.get("models") or {}).items()})


def configured_providers() -> dict[str, ProviderConfig]:
    """Every provider a model name may name: the built-in openai and offline, then LLM_PROVIDERS."""
    entries = {"openai": {"base_url": None, "api_key_env": "OPENAI_API_KEY"},
               OFFLINE_PROVIDER: {"structured_outputs": False}}
    entries.update(getattr(settings, "LLM_PROVIDERS", None) or {})
    return {name: _config(name, entry) for name, entry in entries.items()}


def provider_config(name: str) -> ProviderConfig | None:
    return configured_providers().get(name)


def provider_limits(provider: str, model: str) -> ProviderLimits:
    """The concurrency cap and requests-per-minute limit of calls to `model` on `provider`
    (no limits for a provider that is not configured)."""
    config = provider_config(provider)
    return config.limits_for(model) if config else ProviderLimits()


def structured_outputs(provider: str) -> bool:
    """Whether `provider` honours a json_schema response_format (its ``structured_outputs`` flag); a
    request to one that does not goes without it, and its prompt asks for the format."""
    config = configured_providers().get(provider)
    return config is not None and config.structured_outputs


def one_per_process(build: Callable) -> Callable:
    """`build(*args)` made once for each set of arguments in this process, however many threads ask at once
    (``lru_cache`` alone lets every concurrent first caller build its own), and anew in a forked child (an HTTP
    client's pooled connections are never shared across a fork). For the provider clients."""
    built: dict[tuple, object] = {}
    lock = threading.Lock()

    @functools.wraps(build)
    def get(*args):
        found = built.get(args)  # every model call asks: no lock once built
        if found is not None:
            return found
        with lock:
            if args not in built:
                built[args] = build(*args)
            return built[args]

    def forget_after_fork():
        nonlocal lock
        built.clear()
        lock = threading.Lock()  # a thread of the parent may have held it at the fork

    os.register_at_fork(after_in_child=forget_after_fork)
    get.cache_clear = built.clear  # pyright: ignore[reportAttributeAccessIssue]: wraps' result declares no such attribute; tests clear the clients with it
    return get

"""Start-up checks of the settings (Django's system checks). `migrate` runs them, and `make run` and the
compose services run `migrate` first, so a setting that would break at run time stops start-up, named.

The JSON settings are parsed and checked where the environment is read (config/settings/*); these
checks run the same validators on the values Django ends up with, whatever set them (a settings module
of a deployment, an override), and name the setting and the entry: LLM_PRICES['m'] is refused here, not
by the first priced call. The deploy checks (`manage.py check --deploy`, which compose's migrate step
runs) ask what production needs on top.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from cryptography.fernet import Fernet
from django.conf import settings
from django.core import checks
from django.core.exceptions import ImproperlyConfigured

# the validators the settings modules run on the environment
from config.settings.llm import _model_name, _model_options, _price, _provider_entry

GENERATE_KEY = "python -c 'from cryptography.fernet import Fernet; print(Fernet.generate_key().decode())'"


def _object_problems(name: str, check: Callable) -> Iterator[str]:
    value = getattr(settings, name, None) or {}
    if not isinstance(value, dict):
        yield f"{name} must be an object, got {type(value).__name__}"
        return
    for key, item in value.items():
        problem = check(key, item)
        if problem:
            yield f"{name}[{key!r}]: {problem}"


def _providers_problems() -> Iterator[str]:
    providers = getattr(settings, "LLM_PROVIDERS", None) or {}
    if not isinstance(providers, dict):
        yield f"LLM_PROVIDERS must be an object, got {type(providers).__name__}"
        return
    for name, entry in providers.items():
        try:
            _provider_entry(name, entry, f"LLM_PROVIDERS[{name!r}]")
        except ImproperlyConfigured as exc:
            yield str(exc).rstrip(".")


def _retention_problems() -> Iterator[str]:
    from durable.retention import policy_validate

    policies = getattr(settings, "DURABLE_RETENTION_POLICIES", None) or []
    if not isinstance(policies, list | tuple):
        yield f"DURABLE_RETENTION_POLICIES must be a list of policies, got {type(policies).__name__}"
        return
    for index, policy in enumerate(policies):
        try:
            policy_validate(policy)
        except ImproperlyConfigured as exc:
            yield f"DURABLE_RETENTION_POLICIES[{index}]: {exc}"


@checks.register()
def json_settings_check(app_configs=None, **kwargs) -> list[checks.CheckMessage]:
    """LLM_PRICES, LLM_PROVIDERS, LLM_MODEL_TIERS, LLM_MODEL_OPTIONS and DURABLE_RETENTION_POLICIES."""
    problems = [*_object_problems("LLM_PRICES", _price), *_providers_problems(),
                *_object_problems("LLM_MODEL_TIERS", _model_name),
                *_object_problems("LLM_MODEL_OPTIONS", _model_options), *_retention_problems()]
    return [checks.Error(f"{problem}.", hint="README, Configuration, documents the setting.", id="lineage.E001")
            for problem in problems]


@checks.register()
def encryption_keys_check(app_configs=None, **kwargs) -> list[checks.CheckMessage]:
    """Every key of FIELD_ENCRYPTION_KEYS and DURABLE_PAYLOAD_KEYS is a Fernet key (a bad one fails the first
    secret or payload read or written)."""
    errors = []
    for name in ("FIELD_ENCRYPTION_KEYS", "DURABLE_PAYLOAD_KEYS"):
        for index, key in enumerate(getattr(settings, name, None) or []):
            try:
                Fernet(key.encode() if isinstance(key, str) else key)
            except (ValueError, TypeError) as exc:
                errors.append(checks.Error(f"{name}[{index}] is not a Fernet key ({exc}).",
                                           hint=f"Generate one with {GENERATE_KEY}", id="lineage.E002"))
    return errors


@checks.register(deploy=True)
def production_encryption_keys_check(app_configs=None, **kwargs) -> list[checks.CheckMessage]:
    """Production sets FIELD_ENCRYPTION_KEYS: without it the key derives from SECRET_KEY, and rotating
    SECRET_KEY would leave every stored secret (MCP credentials) unreadable."""
    if settings.DEBUG or getattr(settings, "FIELD_ENCRYPTION_KEYS", None):
        return []
    return [checks.Error(
        "FIELD_ENCRYPTION_KEYS is not set: stored secrets are encrypted with a key derived from SECRET_KEY, "
        "so changing SECRET_KEY would make every one of them unreadable.",
        hint=f"Set FIELD_ENCRYPTION_KEYS to a Fernet key ({GENERATE_KEY}) before storing secrets; secrets "
             "stored under the derived key must then be entered again.",
        id="lineage.E003")]

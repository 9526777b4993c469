"""The start-up checks (config/checks.py): a bad value is an Error naming the setting and the entry."""

import os
import subprocess
import sys

import pytest
from cryptography.fernet import Fernet
from django.core import checks

from config.checks import encryption_keys_check, json_settings_check, production_encryption_keys_check
from config.supervisor import BASE_DIR


def _messages(errors):
    assert all(isinstance(error, checks.Error) for error in errors)
    return [error.msg for error in errors]


def test_the_configured_settings_pass():
    assert json_settings_check() == []
    assert encryption_keys_check() == []


@pytest.mark.parametrize(("setting", "value", "named"), [
    ("LLM_PRICES", {"m": 5}, "LLM_PRICES['m']: must be an object"),
    ("LLM_PRICES", {"m": {"input": "cheap"}}, "LLM_PRICES['m']: input must be a USD amount"),
    ("LLM_PROVIDERS", {"ollama": {"base_url": "localhost:11434"}}, "LLM_PROVIDERS['ollama']: base_url must be"),
    ("LLM_PROVIDERS", {"ollama": {"base_url": "http://h/v1", "max_concurrency": 0}},
     "LLM_PROVIDERS['ollama']: max_concurrency must be"),
    ("LLM_MODEL_TIERS", {"haiku": ""}, "LLM_MODEL_TIERS['haiku']: must be a model name"),
    ("LLM_MODEL_OPTIONS", {"o1*": {"temperature": "no"}}, "LLM_MODEL_OPTIONS['o1*']: temperature must be"),
    ("DURABLE_RETENTION_POLICIES", [{"statuses": ["completed"]}],
     "DURABLE_RETENTION_POLICIES[0]: max_age_days and/or max_count is required"),
    ("DURABLE_RETENTION_POLICIES", [{"statuses": ["completed"], "max_age_days": 30},
                                    {"statuses": ["running"], "max_count": 5}],
     "DURABLE_RETENTION_POLICIES[1]: statuses must be a list of terminal statuses"),
    ("DURABLE_RETENTION_POLICIES", [{"statuses": ["failed"], "max_age_days": "thirty"}],
     "DURABLE_RETENTION_POLICIES[0]: max_age_days must be a whole number"),
    # Postgres cannot subtract so many days from now, nor skip so many rows: every retention pass would fail
    ("DURABLE_RETENTION_POLICIES", [{"statuses": ["failed"], "max_age_days": 1_000_000_000}],
     "DURABLE_RETENTION_POLICIES[0]: max_age_days must be a whole number"),
    ("DURABLE_RETENTION_POLICIES", [{"statuses": ["failed"], "max_count": 10**19}],
     "DURABLE_RETENTION_POLICIES[0]: max_count must be a whole number"),
    ("DURABLE_RETENTION_POLICIES", {"statuses": ["failed"], "max_age_days": 3},
     "DURABLE_RETENTION_POLICIES must be a list of policies"),
])
def test_a_bad_json_setting_is_an_error_naming_the_setting_and_the_entry(settings, setting, value, named):
    setattr(settings, setting, value)
    messages = _messages(json_settings_check())
    assert len(messages) == 1 and messages[0].startswith(named), messages


@pytest.mark.parametrize("setting", ["FIELD_ENCRYPTION_KEYS", "DURABLE_PAYLOAD_KEYS"])
def test_a_key_that_is_not_a_fernet_key_is_an_error_naming_the_setting(settings, setting):
    setattr(settings, setting, [Fernet.generate_key().decode(), "not-a-key"])
    assert _messages(encryption_keys_check()) == [
        f"{setting}[1] is not a Fernet key (Fernet key must be 32 url-safe base64-encoded bytes.)."]


def test_production_without_field_encryption_keys_is_a_deploy_error(settings):
    settings.DEBUG = False
    settings.FIELD_ENCRYPTION_KEYS = []
    (message,) = _messages(production_encryption_keys_check())
    assert message.startswith("FIELD_ENCRYPTION_KEYS is not set")
    settings.FIELD_ENCRYPTION_KEYS = [Fernet.generate_key().decode()]
    assert production_encryption_keys_check() == []


def _manage(*args, **overrides):
    return subprocess.run([sys.executable, "manage.py", *args], cwd=BASE_DIR, env={**os.environ, **overrides},
                          capture_output=True, text=True, timeout=120)


def test_a_retention_policy_missing_its_limit_stops_start_up_named():
    """It passed start-up, then failed every retention pass (once a minute) with an error in the log."""
    result = _manage("check", DURABLE_RETENTION_POLICIES='[{"statuses": ["completed"]}]')
    assert result.returncode != 0
    assert "DURABLE_RETENTION_POLICIES[0]: max_age_days and/or max_count is required" in result.stderr


def test_check_deploy_refuses_production_without_field_encryption_keys():
    result = _manage("check", "--deploy", "--fail-level", "ERROR", DEBUG="false", FIELD_ENCRYPTION_KEYS="",
                     SECRET_KEY="x" * 20 + "-production-secret-key-0123456789abcdef",
                     ALLOWED_HOSTS="lineage.example.com")
    assert result.returncode != 0
    assert "lineage.E003" in result.stderr and "FIELD_ENCRYPTION_KEYS is not set" in result.stderr

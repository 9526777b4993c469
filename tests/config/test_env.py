import os
import subprocess
import sys

import pytest
from cryptography.fernet import Fernet
from django.core.exceptions import ImproperlyConfigured

from config import env
from config.supervisor import BASE_DIR


def test_typed_helpers_parse_and_default(monkeypatch):
    monkeypatch.setenv("X_BOOL", "yes")
    monkeypatch.setenv("X_INT", "42")
    monkeypatch.setenv("X_LIST", "a, b,,c")
    monkeypatch.delenv("X_MISSING", raising=False)
    assert env.env_bool("X_BOOL") is True
    assert env.env_int("X_INT", minimum=1) == 42
    assert env.env_list("X_LIST") == ["a", "b", "c"]
    assert env.env_int("X_MISSING", 7) == 7


@pytest.mark.parametrize(
    ("name", "value", "reader"),
    [
        ("X_BOOL", "maybe", lambda: env.env_bool("X_BOOL")),
        ("X_INT", "12abc", lambda: env.env_int("X_INT")),
        ("X_INT", "0", lambda: env.env_int("X_INT", minimum=1)),
        ("X_URL", "mysql://db/x", lambda: env.env_url("X_URL", schemes=("postgres",))),
    ],
)
def test_bad_values_raise_naming_the_variable(monkeypatch, name, value, reader):
    monkeypatch.setenv(name, value)
    with pytest.raises(ImproperlyConfigured, match=name):
        reader()


def test_missing_required_value_names_the_variable(monkeypatch):
    monkeypatch.delenv("X_REQUIRED", raising=False)
    with pytest.raises(ImproperlyConfigured, match="X_REQUIRED is required"):
        env.env_str("X_REQUIRED")


def _start(**overrides):
    environment = {**os.environ, **overrides}
    return subprocess.run(
        [sys.executable, "manage.py", "check"], cwd=BASE_DIR, env=environment, capture_output=True, text=True,
        timeout=60,
    )


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("DEBUG", "perhaps"),
        ("DATABASE_URL", "mysql://localhost/lineage"),
        ("REDIS_URL", "http://localhost:6379"),
        ("EMBEDDING_DIMENSIONS", "lots"),
        ("OPENAI_BASE_URL", "localhost:8080"),
        ("EVAL_SPLIT_PROPORTIONS", "50,50"),
        ("EVAL_SPLIT_PROPORTIONS", "50,0,50"),
        ("EVAL_MIN_SPLIT_ITEMS", "6"),
    ],
)
def test_bad_environment_stops_start_up_with_the_variable_named(variable, value):
    result = _start(**{variable: value})
    assert result.returncode != 0
    assert "ImproperlyConfigured" in result.stderr
    assert variable in result.stderr.splitlines()[-1]


def test_production_requires_a_secret_key():
    result = _start(DEBUG="false", SECRET_KEY="")
    assert result.returncode != 0
    assert "SECRET_KEY" in result.stderr.splitlines()[-1]


def test_production_settings_pass_check_deploy():
    environment = {**os.environ, "DEBUG": "false", "SECRET_KEY": "x" * 20 + "-production-secret-key-0123456789abcdef",
                   "ALLOWED_HOSTS": "lineage.example.com", "FIELD_ENCRYPTION_KEYS": Fernet.generate_key().decode()}
    result = subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"], cwd=BASE_DIR,
        env=environment, capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_manage_py_without_a_database_url_joins_the_running_services():
    """With no DATABASE_URL, manage.py runs under the embedded services of its data directory; here the
    supervisor running this test suite holds that directory, so the command joins its services."""
    environment = {key: value for key, value in os.environ.items()
                   if key not in {"DATABASE_URL", "REDIS_URL", "SECRET_KEY", "DEBUG"}}
    assert environment["LINEAGE_DATA_DIR"]  # set by the supervisor of `make test`
    result = subprocess.run([sys.executable, "manage.py", "check", "--database", "default"], cwd=BASE_DIR,
                            env=environment, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "System check identified no issues" in result.stdout
    assert "[lineage]" not in result.stdout + result.stderr  # joined: nothing was started or stopped


def test_an_embedding_provider_of_llm_providers_needs_its_model_named():
    """An Ollama or vLLM entry has no default embedding model: start-up says so by name (it died on None)."""
    result = _start(EMBEDDING_PROVIDER="ollama", LLM_PROVIDERS='{"ollama": {"base_url": "http://127.0.0.1:11434/v1"}}')
    assert result.returncode != 0
    assert "ImproperlyConfigured" in result.stderr and "EMBEDDING_MODEL" in result.stderr.splitlines()[-1]

"""`manage.py <command>` on a database that was never migrated says what to run, without a traceback."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.db import connection

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def empty_database(django_db_blocker):
    name = "lineage_never_migrated"
    with django_db_blocker.unblock(), connection.cursor() as cursor:
        cursor.execute(f"DROP DATABASE IF EXISTS {name}")
        cursor.execute(f"CREATE DATABASE {name}")
    url = os.environ["DATABASE_URL"].rsplit("/", 1)[0] + "/" + name
    yield url
    with django_db_blocker.unblock(), connection.cursor() as cursor:
        cursor.execute(f"DROP DATABASE IF EXISTS {name}")


def test_a_command_before_the_first_migrate_says_to_migrate(empty_database):
    result = subprocess.run([sys.executable, "manage.py", "durable", "list"], cwd=ROOT, capture_output=True,
                            text=True, timeout=120, env={**os.environ, "DATABASE_URL": empty_database})
    assert result.returncode == 1
    assert "The database has no tables yet: run `.venv/bin/python manage.py migrate`" in result.stderr
    assert "Traceback" not in result.stderr and "does not exist" not in result.stderr

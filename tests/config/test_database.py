import threading

import pytest
from django.db import connection

pytestmark = pytest.mark.django_db


def test_vector_and_trigram_extensions_are_installed():
    with connection.cursor() as cursor:
        cursor.execute("SELECT extname FROM pg_extension")
        names = {row[0] for row in cursor.fetchall()}
    assert {"vector", "pg_trgm"} <= names


def test_vector_operators_work():
    with connection.cursor() as cursor:
        cursor.execute("SELECT '[1,0,0]'::vector <=> '[0,1,0]'::vector, similarity('lineage', 'linage')")
        distance, similarity = cursor.fetchone()
    assert distance == pytest.approx(1.0)
    assert similarity > 0.4


@pytest.mark.django_db(transaction=True)
def test_migrate_waits_for_the_advisory_lock(settings):
    """A second `migrate` blocks while another holds the lock, then runs once it is released."""
    from django.core.management import call_command

    from config.management.commands.migrate import MIGRATE_LOCK_KEY

    holder = connection.get_new_connection(connection.get_connection_params())
    holder.autocommit = True
    holder.execute("SELECT pg_advisory_lock(%s)", [MIGRATE_LOCK_KEY])
    done = threading.Event()
    errors = []

    def migrate():
        from django.db import connections

        try:
            call_command("migrate", verbosity=0)
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)
        finally:
            connections.close_all()
            done.set()

    thread = threading.Thread(target=migrate)
    thread.start()
    try:
        assert not done.wait(1.0), "migrate ran while another process held the migration lock"
        waiting = holder.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted AND objid = %s",
            [MIGRATE_LOCK_KEY & 0xFFFFFFFF],
        ).fetchone()[0]
        assert waiting == 1
    finally:
        holder.execute("SELECT pg_advisory_unlock(%s)", [MIGRATE_LOCK_KEY])
        holder.close()
    assert done.wait(30)
    thread.join()
    assert errors == []

import pytest

from durable.codec import decode
from durable.inprocess import run_until_settled
from durable.models import StepCheckpoint
from durable.services import run_start

pytestmark = pytest.mark.django_db


def test_inline_steps_complete_and_checkpoint_once():
    run = run_start(workflow="tests.sequence", input={"steps": 5})
    run = run_until_settled(run.id)
    assert run.status == "completed"
    assert decode(run.output) == {"total": 10}
    assert StepCheckpoint.objects.filter(run=run).count() == 5
    assert run.turns == 1


def test_queued_steps_suspend_and_resume():
    run = run_until_settled(run_start(workflow="tests.queued").id)
    assert run.status == "completed", run.error
    assert decode(run.output) == 13
    assert run.turns == 3


@pytest.mark.django_db
def test_the_engines_hot_statements_are_prepared_on_the_server():
    """The store marks its per-turn statements `prepare=True`; Django turns prepared statements off unless
    the connection's `prepare_threshold` says otherwise, which left every turn parsing and planning them."""
    from django.db import connection

    from durable import store

    store.run_claim(store.raw_cursor(), "no-such-run", "a-token", 30)
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_prepared_statements WHERE statement LIKE %s",
                       ["%locked_until = statement_timestamp()%"])
        assert cursor.fetchone()[0] == 1


@pytest.mark.django_db(transaction=True)
def test_turns_still_run_after_a_migration_changed_a_column_the_claim_returns():
    """A deploy's migration, run from another process, widens a column the claim returns while this
    worker's connection holds the claim prepared."""
    from django.db import connections

    assert run_until_settled(run_start(workflow="tests.sequence", input={"steps": 1}).id).status == "completed"
    other = connections.create_connection("default")
    try:
        with other.cursor() as cursor:
            cursor.execute("ALTER TABLE durable_durablerun ALTER COLUMN workflow TYPE varchar(300)")
        for _ in range(2):  # not only the first turn after it: every later one on this connection too
            run = run_until_settled(run_start(workflow="tests.sequence", input={"steps": 1}).id, max_wait=10)
            assert run.status == "completed", run.error
    finally:
        with other.cursor() as cursor:
            cursor.execute("ALTER TABLE durable_durablerun ALTER COLUMN workflow TYPE varchar(200)")
        other.close()

"""Helpers for the engine's race tests: code run in another thread with its own database connection,
the tick run while it works, and database statements made to fail on cue."""

import contextlib
import threading
import time

from django.db import connection, connections

from durable import tick


def in_thread(target, *args, wrapper=None):
    """Run `target(*args)` in a thread with its own connection (its statements optionally passed through
    `wrapper`, a Django execute wrapper); returns (thread, outcome) with outcome["value"] or ["error"]."""
    outcome = {}

    def run():
        try:
            if wrapper is None:
                outcome["value"] = target(*args)
            else:
                with connection.execute_wrapper(wrapper):
                    outcome["value"] = target(*args)
        except BaseException as exc:
            outcome["error"] = exc
        finally:
            connections.close_all()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, outcome


def time_out_silent_steps_while(thread, observe=None) -> int:
    """Run the tick's timeout pass while `thread` works, as beat would (calling `observe()` after each
    pass, to watch the rows meanwhile); returns the steps it timed out."""
    timed_out = 0
    while thread.is_alive():
        timed_out += tick.time_out_silent_steps()
        if observe is not None:
            observe()
        time.sleep(0.05)
    thread.join()
    return timed_out


def wait_until(predicate, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.02)
    raise AssertionError("condition never held")


@contextlib.contextmanager
def statement_fails_once(name: str, *, on: str, when: str, errcode: str, message: str):
    """A trigger on durable_stepcheckpoint (`on`: INSERT or UPDATE) that raises `errcode` the first time
    `when` (a condition on NEW / OLD) holds, as a failover or a lock timeout would. Yields `fired()`,
    which says whether it has raised yet (a test whose statement never ran would pass for nothing)."""
    with connection.cursor() as cursor:
        cursor.execute(f"""
            CREATE SEQUENCE {name}_once;
            CREATE FUNCTION {name}() RETURNS trigger AS $$
            BEGIN
                IF ({when}) THEN  -- nested, so the sequence counts only matching rows
                    IF nextval('{name}_once') = 1 THEN
                        RAISE EXCEPTION '{message}' USING ERRCODE = '{errcode}';
                    END IF;
                END IF;
                RETURN NEW;
            END $$ LANGUAGE plpgsql;
            CREATE TRIGGER {name} BEFORE {on} ON durable_stepcheckpoint FOR EACH ROW EXECUTE FUNCTION {name}();
        """)

    def fired() -> bool:
        with connection.cursor() as cursor:
            cursor.execute(f"SELECT is_called FROM {name}_once")
            return cursor.fetchone()[0]

    try:
        yield fired
    finally:
        with connection.cursor() as cursor:
            cursor.execute(f"DROP TRIGGER {name} ON durable_stepcheckpoint; DROP FUNCTION {name}(); "
                           f"DROP SEQUENCE {name}_once;")

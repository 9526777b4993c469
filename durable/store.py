"""Every statement that changes a run's or a step's status, in one place.

The turn code (``durable.turns``, ``durable.context``), the queued-step worker
(``durable.steps``), the tick, the operator services and retention call these named
functions; none of them writes a status of its own. Each transition is a compare-and-set,
and its docstring says what a crash right after its commit leaves behind and who picks it
up.

Fences. A turn's writes are fenced by its lease: each one holds a share lock on the run row
while it checks ``locked_by`` is still this turn's token, so a cancel, a lease recovery or a
retry (which all rewrite the run row) either waits for the write to commit or makes it
refuse. The one exception is the hot path, a completed inline step or recorded value with no
other effect: it is stamped with the run's history fence instead (moved on by every retry and
continue-as-new), so a late write of a turn that lost its run lands, at worst, in the history
it was running (where the unique (run, seq) keeps one result) and is dropped by the next replay
of any newer history. A queued step's settle is fenced by the checkpoint row's id and attempt: a
retry deletes and re-creates checkpoints (new ids) and every claim increments the attempt, so the
pair never repeats and a slow worker's old result never lands in a new attempt. A child's report
to its parent is fenced by the child's run id, which changes with every new history (epoch) of
the parent.

Lock order. Advisory locks first (a signal's or an event's), then run rows (a child before its
parent; a cancel locks descendants leaf first, then the root), then checkpoint rows. Every path
that settles a checkpoint and wakes its run locks the run's row before touching the checkpoint
(``lock_runs``), which also serialises the join check of two settlers of one fan; so settles,
deliveries, cancels and finishes never deadlock one another.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from datetime import datetime

import psycopg
from django.core.serializers.json import DjangoJSONEncoder
from django.db import connection, transaction
from django.utils.timezone import now

from config import telemetry
from durable.codec import decode, encode
from durable.dispatch import dispatch_steps, dispatch_turn
from durable.settings import durable_settings
from durable.states import RunStatus, StepStatus

RUN_TABLE = "durable_durablerun"
CP_TABLE = "durable_stepcheckpoint"
WAITER_TABLE = "durable_signalwaiter"
SIGNAL_TABLE = "durable_bufferedsignal"
EVENT_TABLE = "durable_bufferedevent"
ATTR_TABLE = "durable_runattribute"



def _sql_list(values: Iterable[str]) -> str:
    return "(" + ", ".join(f"'{value}'" for value in sorted(values)) + ")"


ACTIVE = _sql_list(RunStatus.ACTIVE)  # ('pending', 'running', 'suspended')
OPEN = _sql_list(StepStatus.OPEN)  # ('pending', 'running')

# a turn's write goes through only while the run is still leased to that turn
LEASE_FENCE = f"EXISTS (SELECT 1 FROM {RUN_TABLE} WHERE id = %s AND locked_by = %s FOR SHARE)"


def raw_cursor() -> psycopg.Cursor:
    """A server-side-binding psycopg cursor on Django's connection, so hot statements get prepared."""
    connection.ensure_connection()
    return psycopg.Cursor(connection.connection)


def execute_prepared(cursor: psycopg.Cursor, sql: str, params) -> psycopg.Cursor:
    """Run one of the engine's hot statements prepared on `cursor` (a ``raw_cursor``).

    A migration run from another process (a deploy) that changes the type of a column a prepared statement
    returns leaves its plan unusable in every session that holds it: "cached plan must not change result
    type". Inside a transaction the rollback that follows the error makes psycopg forget its prepared
    statements; outside one nothing would, and the statement would fail on this connection for as long
    as the pool keeps it (every claim of every turn). So then they are deallocated (psycopg clears its own
    cache when it sees DEALLOCATE ALL) and the statement runs once more, prepared afresh."""
    try:
        return cursor.execute(sql, params, prepare=True)  # pyright: ignore[reportArgumentType]: the engine's own statements, never built from input
    except psycopg.errors.FeatureNotSupported as exc:
        idle = cursor.connection.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
        if not idle or "cached plan must not change result type" not in str(exc):
            raise
        cursor.connection.execute("DEALLOCATE ALL")
        return cursor.execute(sql, params, prepare=True)  # pyright: ignore[reportArgumentType]: as above


# ---------------------------------------------------------------------------------------- creation


INSERT_RUN_SQL = f"""
INSERT INTO {RUN_TABLE} (id, workflow, namespace, status, input, output, error, tags, priority, parent_id,
    parent_seq, wake_pending, dispatched_at, locked_by, recovery_attempts, turns, epoch, trace_context, created_at,
    updated_at)
VALUES (%s, %s, %s, 'pending', %s, '', '', %s, %s, %s, %s, true, statement_timestamp(), '', 0, 0, 0, %s,
        statement_timestamp(), statement_timestamp())
ON CONFLICT (id) DO NOTHING
"""


def run_insert(*, run_id: str, workflow: str, input_text: str, namespace: str, tags: Sequence[str], priority: int,
               parent_id: str | None = None, parent_seq: int | None = None, dispatch: bool = True) -> bool:
    """Insert a pending run (idempotent on its id) and dispatch its first turn after commit.
    Crash after commit: the row is pending with wake_pending, so the tick's lost-wake pass sends
    the turn. Returns False when the id exists."""
    with connection.cursor() as cursor:
        cursor.execute(INSERT_RUN_SQL, [run_id, workflow, namespace, input_text, list(tags), priority, parent_id,
                                        parent_seq, telemetry.run_start_context(run_id=run_id, workflow=workflow)])
        created = cursor.rowcount == 1
    if created and dispatch:
        dispatch_turn(run_id, priority)
    return created


# ------------------------------------------------------------------------------------------- locks


def lock_runs(run_ids: Sequence[str]) -> list[str]:
    """Lock runs' rows for a change of their checkpoints (the rule: advisory locks, then run rows,
    children before parents, then checkpoint rows). Returns the ids of those still active."""
    with connection.cursor() as cursor:
        # a child's id extends its parent's, so longer ids first puts children before their parents
        cursor.execute(f"SELECT id, status FROM {RUN_TABLE} WHERE id = ANY(%s) ORDER BY length(id) DESC, id "
                       "FOR NO KEY UPDATE", [list(run_ids)])
        return [run_id for run_id, status in cursor.fetchall() if status in RunStatus.ACTIVE]


# ------------------------------------------------------------------------------------------- wakes


WAKE_SQL = f"""
UPDATE {RUN_TABLE} SET wake_pending = true, dispatched_at = statement_timestamp(), updated_at = statement_timestamp()
WHERE id = ANY(%s) AND status IN {ACTIVE}
RETURNING id, priority, (status = 'running' AND locked_until > statement_timestamp()) AS busy
"""


def runs_wake(run_ids: Iterable[str]) -> set[str]:
    """Ask for a turn of each run, in one statement. A run whose turn is in flight is only flagged:
    that turn sees the flag when it releases the run and dispatches the next turn itself, so a wake
    during a turn is never lost. Called inside the transaction of the change that caused it; crash
    after commit: wake_pending is set and the tick re-sends the turn. Returns the active runs woken."""
    run_ids = list(run_ids)
    if not run_ids:
        return set()
    with connection.cursor() as cursor:
        cursor.execute(WAKE_SQL, [run_ids])
        rows = cursor.fetchall()
    for run_id, priority, busy in rows:
        if not busy:
            dispatch_turn(run_id, priority)
    return {row[0] for row in rows}


def run_wake(run_id: str) -> bool:
    """Ask for a turn of one run (see ``runs_wake``); False when it is not active."""
    return bool(runs_wake([run_id]))


FAN_PENDING_SQL = f"""
SELECT seq FROM {CP_TABLE}
WHERE run_id = %s AND parallel_group = %s AND status IN {OPEN}
ORDER BY seq DESC LIMIT 1
"""


def fan_has_pending(run_id: str, group: int) -> bool:
    cursor = raw_cursor()
    execute_prepared(cursor, FAN_PENDING_SQL, (run_id, group))
    return cursor.fetchone() is not None


def fan_join_wake(run_id: str, groups: Iterable[int]) -> bool:
    """Wake the run if one of these fans has nothing left open. Runs inside the settling
    transaction, after the settle, with the run's row locked (``lock_runs``): that lock serialises
    every settler of the run, so when two workers settle a fan's last chunks at once the second
    sees the first's commit (each check is a new statement, hence a new snapshot) and wakes it."""
    if any(not fan_has_pending(run_id, group) for group in sorted(set(groups))):
        return run_wake(run_id)
    return False


# ------------------------------------------------------------------------------------------- turns


CLAIM_SQL = f"""
UPDATE {RUN_TABLE}
SET status = 'running', locked_by = %s, locked_until = statement_timestamp() + make_interval(secs => %s),
    wake_pending = false, wake_at = NULL, turns = turns + 1, started_at = COALESCE(started_at, statement_timestamp()),
    updated_at = statement_timestamp()
WHERE id = %s AND status IN {ACTIVE} AND (locked_until IS NULL OR locked_until < statement_timestamp())
RETURNING workflow, input, namespace, priority, tags, turns, parent_id, epoch, fence, trace_context
"""


# a run's first turn only: what a worker following a child it started claims (turns.execute_turn)
FIRST_CLAIM_SQL = CLAIM_SQL.replace("\nRETURNING", " AND turns = 0\nRETURNING")


def run_claim(cursor: psycopg.Cursor, run_id: str, token: str, lease_seconds: float, *, first: bool = False):
    """Take the run's lease for one turn (with `first`, only for its first turn). Crash after commit: the
    lease expires and the tick's recovery pass hands the run to another worker (counting a recovery
    attempt)."""
    execute_prepared(cursor, FIRST_CLAIM_SQL if first else CLAIM_SQL, (token, lease_seconds, run_id))
    return cursor.fetchone()


RELEASE_SQL = f"""
UPDATE {RUN_TABLE}
SET status = 'suspended', wake_at = %s, locked_by = '', locked_until = NULL, updated_at = statement_timestamp(),
    recovery_attempts = 0, wake_pending = wake_pending OR %s,
    dispatched_at = CASE WHEN wake_pending OR %s THEN statement_timestamp() ELSE dispatched_at END
WHERE id = %s AND locked_by = %s AND status = 'running'
RETURNING wake_pending, priority
"""


def run_release(run_id: str, token: str, wake_at: datetime | None, *, wake_now: bool = False) -> bool | None:
    """End a turn that suspended: the run waits for its next wake. A turn that completed normally
    made progress, so the recovery counter resets. Returns whether a new turn was dispatched
    (a wake arrived during the turn, or `wake_now`), None when the lease was lost.
    Crash after commit: a due timer is found by the timer pass, a pending wake by the lost-wake pass."""
    with connection.cursor() as cursor:
        cursor.execute(RELEASE_SQL, [wake_at, wake_now, wake_now, run_id, token])
        row = cursor.fetchone()
    if row is None:
        return None
    wake_pending, priority = row
    if wake_pending:
        dispatch_turn(run_id, priority)
    return bool(wake_pending)


def run_release_aborted(run_id: str, token: str, *, delay_seconds: float, max_attempts: int, error_text: str) -> str:
    """Give the run back after a turn whose engine write failed: it is turned again after
    `delay_seconds` (the timer pass resumes it), counting a recovery attempt; past `max_attempts`
    it is dead. Returns the run's new status, or "" when the lease was already gone."""
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            f"""UPDATE {RUN_TABLE} SET recovery_attempts = recovery_attempts + 1, locked_by = '', locked_until = NULL,
                    status = CASE WHEN recovery_attempts + 1 > %s THEN 'dead' ELSE 'suspended' END,
                    error = CASE WHEN recovery_attempts + 1 > %s THEN %s ELSE error END,
                    ended_at = CASE WHEN recovery_attempts + 1 > %s THEN statement_timestamp() END,
                    wake_at = statement_timestamp() + make_interval(secs => %s), updated_at = statement_timestamp()
                WHERE id = %s AND locked_by = %s AND status = 'running'
                RETURNING status, parent_id, parent_seq""",
            [max_attempts, max_attempts, error_text, max_attempts, delay_seconds, run_id, token],
        )
        row = cursor.fetchone()
        if row is None:
            return ""
        status, parent_id, parent_seq = row
        if status == RunStatus.DEAD:
            _end_open_work([run_id])
            if parent_id:
                child_report(parent_id=parent_id, parent_seq=parent_seq, child_id=run_id, child_status=status,
                             output_text="", error_text=error_text)
    if status == RunStatus.DEAD:
        close_children(run_id)
    return status


def close_children(run_id: str) -> None:
    """Cancel the active descendants of a run that ended where their locks could not be taken first
    (a run declared dead). Best effort after that commit; the retention pass's orphan sweep finds
    any a crash here left behind."""
    runs_cancel_tree(run_id, error_text="", root=False, descendant_error_text=_parent_ended_error(run_id))


FINISH_SQL = f"""
UPDATE {RUN_TABLE}
SET status = %s, output = %s, error = %s, ended_at = statement_timestamp(), locked_by = '', locked_until = NULL,
    wake_at = NULL, wake_pending = false, updated_at = statement_timestamp()
WHERE id = %s AND locked_by = %s AND status = 'running'
RETURNING parent_id, parent_seq
"""


def run_finish(run_id: str, token: str, status: str, *, output_text: str = "", error_text: str = "",
               open_work: bool = False, has_parent: bool = True) -> tuple | None:
    """Record the run's end: a compare-and-set on its status and lease. With `open_work` (the history
    started children or left checkpoints open: a fail_fast's queued steps, waits it stopped waiting
    for) its active descendants are cancelled (the parent-close policy; locked first, leaf first, as
    the lock order wants), its open checkpoints cancelled and its waiters dropped, all in the same
    transaction. A child reports to its parent in the same transaction too (settling the parent's
    checkpoint and, when its join allows, waking it). Crash after commit: nothing is left to do.
    Returns (parent_id, parent_seq), or None when the lease was lost."""
    params = [status, output_text, error_text, run_id, token]
    if not has_parent and not open_work:  # the hot path of a root run: one prepared statement
        cursor = raw_cursor()
        execute_prepared(cursor, FINISH_SQL, params)
        return cursor.fetchone()
    with transaction.atomic(durable=False), connection.cursor() as cursor:
        descendants = _lock_descendants(run_id) if open_work else []
        cursor.execute(FINISH_SQL, params)
        row = cursor.fetchone()
        if row is None:
            return None
        if open_work:
            ended = [run_id]
            if descendants:
                ended += _cancel_runs(descendants, _parent_ended_error(run_id))
            _end_open_work(ended)
        parent_id, parent_seq = row
        if parent_id:
            child_report(parent_id=parent_id, parent_seq=parent_seq, child_id=run_id, child_status=status,
                         output_text=output_text, error_text=error_text)
    return row


def _parent_ended_error(run_id: str) -> str:
    return encode({"type": "Cancelled", "message": f"parent {run_id} ended while this run was active"})


def _lock_descendants(run_id: str) -> list[str]:
    """Lock a run's active descendants, leaf first (the lock order), before the run itself is changed."""
    descendants = descendant_run_ids([run_id], active_only=True)
    if descendants:
        with connection.cursor() as cursor:
            cursor.execute(f"SELECT id FROM {RUN_TABLE} WHERE id = ANY(%s) ORDER BY array_position(%s, id) "
                           "FOR UPDATE", [descendants, descendants])
    return descendants


def _cancel_runs(run_ids: list[str], error_text: str) -> list[str]:
    with connection.cursor() as cursor:
        cursor.execute(CANCEL_SQL, [error_text, run_ids])
        return [row[0] for row in cursor.fetchall()]


def run_continue_as_new(run_id: str, token: str, input_text: str) -> bool:
    """End the run's current history and start afresh with new input under the same id: its active
    children are cancelled (before the new history can start any), its checkpoints and waiters deleted,
    its epoch moves on (children of the new history get new ids) and a first turn is dispatched.
    Crash after commit: the run is pending with wake_pending, found by the lost-wake pass."""
    with transaction.atomic(), connection.cursor() as cursor:
        descendants = _lock_descendants(run_id)
        cursor.execute(
            f"""UPDATE {RUN_TABLE} SET status = 'pending', input = %s, epoch = epoch + 1, fence = fence + 1,
                    turns = 0, locked_by = '', locked_until = NULL, wake_pending = true, wake_at = NULL,
                    recovery_attempts = 0, dispatched_at = statement_timestamp(), updated_at = statement_timestamp()
                WHERE id = %s AND locked_by = %s AND status = 'running' RETURNING priority""",
            [input_text, run_id, token],
        )
        row = cursor.fetchone()
        if row is None:
            return False
        if descendants:
            _end_open_work(_cancel_runs(descendants, _parent_ended_error(run_id)))
        cursor.execute(f"DELETE FROM {CP_TABLE} WHERE run_id = %s", [run_id])
        cursor.execute(f"DELETE FROM {WAITER_TABLE} WHERE run_id = %s", [run_id])
        dispatch_turn(run_id, row[0])
    return True


def runs_renew_leases(leases: dict[str, str], lease_seconds: float) -> set[str]:
    """Extend the leases of the turns this process runs; returns the runs whose lease was renewed
    (a run missing from it was cancelled or recovered: its turn must stop writing)."""
    run_ids, tokens = list(leases), [leases[run_id] for run_id in leases]
    with connection.cursor() as cursor:
        cursor.execute(
            f"""UPDATE {RUN_TABLE} AS r SET locked_until = statement_timestamp() + make_interval(secs => %s)
                FROM unnest(%s::text[], %s::text[]) AS l(id, token)
                WHERE r.id = l.id AND r.locked_by = l.token AND r.status = 'running' RETURNING r.id""",
            [lease_seconds, run_ids, tokens],
        )
        return {row[0] for row in cursor.fetchall()}


# --------------------------------------------------------------------------- a turn's checkpoints


REPLAY_SQL = f"""
SELECT seq, name, kind, status, output, error, parallel_group, attempt, wake_at, queue, child_run_id, fence
FROM {CP_TABLE} WHERE run_id = %s ORDER BY seq
"""


def checkpoints_for_replay(cursor: psycopg.Cursor, run_id: str) -> list[tuple]:
    """Every checkpoint of the run, in sequence order, as a replay reads them (the columns of REPLAY_SQL)."""
    execute_prepared(cursor, REPLAY_SQL, (run_id,))
    return cursor.fetchall()


INSERT_DONE_SQL = f"""
INSERT INTO {CP_TABLE} (run_id, seq, name, kind, status, input, output, error, queue, options, attempt,
                        child_run_id, heartbeat_progress, fence, created_at, started_at, completed_at)
VALUES (%s, %s, %s, %s, 'completed', '', %s, '', '', '{{}}', %s, '', '', %s, %s, %s, statement_timestamp())
ON CONFLICT (run_id, seq) DO NOTHING
"""


INSERT_DONE_LEASED_SQL = f"""
INSERT INTO {CP_TABLE} (run_id, seq, name, kind, status, input, output, error, queue, options, attempt,
                        child_run_id, heartbeat_progress, fence, created_at, started_at, completed_at)
SELECT r.id, %s::int, %s, %s, 'completed', '', %s, '', '', '{{}}'::jsonb, %s::int, '', '', %s::int,
       %s::timestamptz, %s::timestamptz, statement_timestamp()
FROM {RUN_TABLE} r WHERE r.id = %s AND r.locked_by = %s FOR SHARE
ON CONFLICT (run_id, seq) DO NOTHING
"""


def checkpoint_record(cursor: psycopg.Cursor, *, run_id: str, token: str, fence: int, seq: int, name: str,
                      kind: str, output_text: str, attempt: int, started: datetime, leased: bool = False) -> bool:
    """The hot path: a completed checkpoint in one prepared statement, stamped with the run's history fence.

    It does not read the run row (that costs about a fifth of a step): a turn that lost its lease can
    still record a step of the history it was running, which is harmless (the same replay would record
    it; the unique (run, seq) keeps one). Once a retry or continue-as-new moved the fence on, such a
    late write carries the old fence and the next replay drops it. A record that commits together with
    other effects (``ctx.transaction``'s writes, search attributes, a consumed signal or event, a
    fail_fast choice) passes `leased`: it is fenced by the lease like every other write of a turn (waits,
    queued steps, children), so those effects never commit for a turn that lost its run. False when the
    sequence number is taken by a checkpoint of the current history (or, `leased`, the lease is gone).
    An inline step is created when it starts (it never waits in a queue), so created_at is `started`."""
    if leased:
        execute_prepared(cursor, INSERT_DONE_LEASED_SQL,
                         (seq, name, kind, output_text, attempt, fence, started, started, run_id, token))
        return cursor.rowcount == 1
    params = (run_id, seq, name, kind, output_text, attempt, fence, started, started)
    execute_prepared(cursor, INSERT_DONE_SQL, params)
    if cursor.rowcount == 1:
        return True
    if checkpoints_drop_stale(run_id=run_id, token=token, fence=fence, seq=seq):
        execute_prepared(cursor, INSERT_DONE_SQL, params)
        return cursor.rowcount == 1
    return False


def checkpoints_drop_stale(*, run_id: str, token: str, fence: int, seq: int | None = None) -> int:
    """Delete checkpoints of an abandoned history (written under an older fence), while this turn holds
    the lease. Returns rows deleted."""
    sql = f"DELETE FROM {CP_TABLE} WHERE run_id = %s AND fence <> %s AND {LEASE_FENCE}"
    params: list = [run_id, fence, run_id, token]
    if seq is not None:
        sql += " AND seq = %s"
        params.append(seq)
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.rowcount


INSERT_PENDING_COLUMNS = ("run_id", "seq", "name", "kind", "status", "input", "output", "error", "queue", "options",
                          "attempt", "child_run_id", "heartbeat_progress", "parallel_group", "wake_at",
                          "created_at", "started_at", "completed_at", "fence")
_PENDING_TYPES = ("text", "int", "text", "text", "text", "text", "text", "text", "text", "jsonb", "int", "text",
                  "text", "int", "timestamptz", "timestamptz", "timestamptz", "timestamptz", "int")
_PENDING_ROW = "(" + ", ".join(f"%s::{kind}" for kind in _PENDING_TYPES) + ")"


def checkpoint_row(run_id, seq, name, kind, *, input="", queue="", options=None, attempt=0, child_run_id="",
                   group=None, wake_at=None, status="pending", output="", error="", started_at=None,
                   completed_at=None, created=None, fence=0):
    """A row for ``checkpoints_insert`` (the columns of ``INSERT_PENDING_COLUMNS``)."""
    return (run_id, seq, name, kind, status, input, output, error, queue, json.dumps(options or {}), attempt,
            child_run_id, "", group, wake_at, created or now(), started_at, completed_at, fence)


def checkpoints_insert(cursor, rows: list[tuple], *, token: str | None = None, batch: int = 200) -> int:
    """Multi-row inserts of checkpoints (200 rows a statement); returns rows written. With `token`
    each statement is fenced by the turn's lease (rows of the first row's run)."""
    written = 0
    columns = ", ".join(INSERT_PENDING_COLUMNS)
    for start in range(0, len(rows), batch):
        chunk = rows[start:start + batch]
        values = ", ".join([_PENDING_ROW] * len(chunk))
        params = [value for row in chunk for value in row]
        if token is None:
            sql = f"INSERT INTO {CP_TABLE} ({columns}) VALUES {values} ON CONFLICT (run_id, seq) DO NOTHING"
        else:
            sql = (f"INSERT INTO {CP_TABLE} ({columns}) SELECT * FROM (VALUES {values}) AS v WHERE {LEASE_FENCE} "
                   "ON CONFLICT (run_id, seq) DO NOTHING")
            params += [chunk[0][0], token]
        cursor.execute(sql, params)
        written += cursor.rowcount
    return written


def checkpoint_settle(*, run_id: str, token: str, seq: int, status: str, output_text: str = "",
                      error_text: str = "", attempt: int | None = None, set_attempt: int | None = None,
                      wake_at: datetime | None = None) -> bool:
    """Settle (or, with status pending, re-arm for a retry) one of the turn's own open checkpoints:
    a due timer, a wait that timed out, an inline step's retry. Fenced by the lease and, for
    retries, by the attempt it expects."""
    settled = status in StepStatus.SETTLED
    sql = (f"UPDATE {CP_TABLE} SET status = %s, output = %s, error = %s, wake_at = %s, "
           "completed_at = CASE WHEN %s THEN statement_timestamp() END, attempt = COALESCE(%s, attempt) "
           f"WHERE run_id = %s AND seq = %s AND status IN {OPEN} AND {LEASE_FENCE}")
    params = [status, output_text, error_text, wake_at, settled, set_attempt, run_id, seq, run_id, token]
    if attempt is not None:
        sql += " AND attempt = %s"
        params.append(attempt)
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.rowcount == 1


def waiter_insert(*, run_id: str, seq: int, kind: str, key: str, match: dict) -> None:
    """Register a wait; called in the transaction that wrote its (fenced) pending checkpoint."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {WAITER_TABLE} (run_id, seq, kind, key, match, created_at) "
            "VALUES (%s, %s, %s, %s, %s::jsonb, statement_timestamp()) ON CONFLICT (run_id, seq) DO NOTHING",
            [run_id, seq, kind, key, json.dumps(match)],
        )


def waiter_delete(run_id: str, seq: int) -> None:
    with connection.cursor() as cursor:
        cursor.execute(f"DELETE FROM {WAITER_TABLE} WHERE run_id = %s AND seq = %s", [run_id, seq])


def child_lock(child_id: str):
    """An existing child's (status, output, error, parent_id), share-locked until the caller's transaction ends,
    so the child cannot end between this read and the parent's checkpoint insert (its finish would
    then find no checkpoint to settle). None when the child does not exist."""
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT status, output, error, parent_id FROM {RUN_TABLE} WHERE id = %s FOR SHARE",
                       [child_id])
        return cursor.fetchone()


def child_report(*, parent_id: str, parent_seq: int, child_id: str, child_status: str, output_text: str,
                 error_text: str) -> bool:
    """A child ended: settle the parent's checkpoint for it (fenced by the child's id, so a child of
    an earlier history of the parent never settles the current one) and wake the parent when its
    join allows. Runs in the transaction that ended the child. Returns whether it settled."""
    status = StepStatus.COMPLETED if child_status == RunStatus.COMPLETED else StepStatus.FAILED
    if status == StepStatus.FAILED:
        error_text = child_error_text(child_id, child_status, error_text)
    if not lock_runs([parent_id]):
        return False  # the parent ended: its open checkpoints were cancelled with it
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {CP_TABLE} SET status = %s, output = %s, error = %s, completed_at = statement_timestamp(), "
            f"wake_at = NULL WHERE run_id = %s AND seq = %s AND child_run_id = %s AND status IN {OPEN} "
            "RETURNING parallel_group",
            [status, output_text if status == StepStatus.COMPLETED else "", error_text, parent_id, parent_seq,
             child_id],
        )
        row = cursor.fetchone()
    if row is None:
        return False
    group = row[0]
    if group is None or status == StepStatus.FAILED:
        run_wake(parent_id)
    else:
        fan_join_wake(parent_id, [group])
    return True


def child_error_text(child_id: str, child_status: str, error_text: str) -> str:
    error = decode(error_text, column="run.error", row=child_id) if error_text else None
    if not isinstance(error, dict):
        error = {}
    message = error.get("message") or f"child run {child_id} ended {child_status}"
    return encode({"type": error.get("type") or "ChildFailed", "message": message, "child_run_id": child_id,
                   "child_status": child_status})


# ------------------------------------------------------------------------------------ queued steps


CLAIM_STEPS_SQL = f"""
UPDATE {CP_TABLE} AS cp
SET status = 'running', started_at = statement_timestamp(), attempt = cp.attempt + 1,
    last_heartbeat_at = statement_timestamp(), wake_at = NULL,
    timeout_at = statement_timestamp() + make_interval(
        secs => COALESCE((cp.options->>'timeout')::float8, %s)
                + LEAST(1.0, COALESCE((cp.options->>'timeout')::float8, %s) / 3))
WHERE cp.run_id = %s AND cp.seq = ANY(%s) AND cp.status = 'pending' AND cp.queue <> ''
  AND EXISTS (SELECT 1 FROM {RUN_TABLE} r WHERE r.id = cp.run_id AND r.status IN {ACTIVE})
RETURNING cp.id, cp.seq, cp.name, cp.input, cp.options, cp.attempt, cp.parallel_group
"""


def steps_claim(run_id: str, seqs: Sequence[int], default_timeout: float) -> list[tuple]:
    """Claim queued steps of an active run (pending -> running, attempt + 1, silence clock armed with the
    grace of ``clock_grace``, since the keeper re-arms waiting steps only that often).
    Crash after commit: the steps stay running until their timeout passes, then the tick's
    timeout pass puts them back to pending and re-dispatches them."""
    with connection.cursor() as cursor:
        cursor.execute(CLAIM_STEPS_SQL, [default_timeout, default_timeout, run_id, list(seqs)])
        return sorted(cursor.fetchall(), key=lambda row: row[1])


def clock_grace(timeout: float) -> float:
    """How often the keeper re-arms a chunk's waiting steps, and the grace their clocks get for it."""
    return min(1.0, timeout / 3)


def steps_rearm(steps: Sequence[tuple[int, int]], *, grace_seconds: float) -> set[int]:
    """Re-arm the silence clocks of claimed steps that are not running ((id, attempt) pairs): the worker
    holding them is alive. Returns the ids still held (a step that timed out meanwhile is not)."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"""UPDATE {CP_TABLE} AS cp
                SET timeout_at = statement_timestamp() + make_interval(secs => %s + COALESCE(
                    (cp.options->>'timeout')::float8, %s))
                FROM unnest(%s::bigint[], %s::int[]) AS c(id, attempt)
                WHERE cp.id = c.id AND cp.attempt = c.attempt AND cp.status = 'running'
                RETURNING cp.id""",
            [grace_seconds, durable_settings().step_default_timeout, [step[0] for step in steps],
             [step[1] for step in steps]],
        )
        return {row[0] for row in cursor.fetchall()}


def steps_settle(run_id: str, settlements: list[tuple]) -> list[tuple]:
    """Settle results of one run's claimed steps and wake the run, in one transaction.

    Each settlement is (id, attempt, status, output, error, retry_wake_at, started_at[, options
    patch]): a compare-and-set on the checkpoint's id, attempt and running status that never rewrites
    the input (the patch, JSON merged into the options, counts a put-off step's deferrals). The run's
    row is locked first (the lock order), which also serialises the fan join check of concurrent
    settlers. The wake (a finished sequential step, any failure, or a fan with
    nothing left open) commits with the settle, so a crash after commit loses nothing.
    Returns the settled (seq, status, group) rows."""
    settled: list[tuple] = []
    with transaction.atomic(), connection.cursor() as cursor:
        if not lock_runs([run_id]):
            return []  # the run ended: its open steps were cancelled with it
        for start in range(0, len(settlements), 200):
            chunk = [row if len(row) == 8 else (*row, None) for row in settlements[start:start + 200]]
            values = ", ".join(["(%s::bigint, %s::int, %s, %s, %s, %s::timestamptz, %s::timestamptz, %s::jsonb)"]
                               * len(chunk))
            cursor.execute(
                f"""UPDATE {CP_TABLE} AS cp
                        SET status = v.status, output = v.output, error = v.error, wake_at = v.wake_at,
                            timeout_at = NULL, started_at = COALESCE(v.started_at, cp.started_at),
                            options = COALESCE(cp.options || v.patch, cp.options),
                            completed_at = CASE WHEN v.status IN ('completed', 'failed') THEN statement_timestamp() END
                        FROM (VALUES {values}) AS v(id, attempt, status, output, error, wake_at, started_at, patch)
                        WHERE cp.id = v.id AND cp.attempt = v.attempt AND cp.status = 'running'
                        RETURNING cp.seq, cp.status, cp.parallel_group""",
                [value for row in chunk for value in row],
            )
            settled.extend(cursor.fetchall())
        wake = False
        groups = set()
        for _seq, status, group in settled:
            if status == StepStatus.PENDING:
                continue  # a retry is scheduled; the tick dispatches it when due
            if group is None or status == StepStatus.FAILED:
                wake = True
            else:
                groups.add(group)
        if wake:
            run_wake(run_id)
        elif groups:
            fan_join_wake(run_id, groups)
    return settled


def step_heartbeat(*, step_id: int, attempt: int, timeout: float | None, progress_text: str) -> bool:
    """A running step's persisted heartbeat: re-arms its silence clock and records progress."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {CP_TABLE} SET last_heartbeat_at = statement_timestamp(), heartbeat_progress = %s, "
            "timeout_at = CASE WHEN %s::float8 IS NULL THEN NULL "
            "ELSE statement_timestamp() + make_interval(secs => %s::float8) END "
            "WHERE id = %s AND attempt = %s AND status = 'running'",
            [progress_text, timeout, timeout, step_id, attempt],
        )
        return cursor.rowcount == 1


def steps_time_out(*, max_timeouts: int, error_text: str, batch: int) -> list[tuple]:
    """Running queued steps silent past their timeout (their runs' rows locked first, skipping runs
    another transaction holds): the attempt is abandoned and the step goes back to pending for a
    re-dispatch (or fails once it timed out more than `max_timeouts` times, waking the run in the same
    transaction). Crash after commit: the pending step's wake_at is due, so the
    due-step pass re-dispatches it."""
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            f"""UPDATE {CP_TABLE}
                SET status = CASE WHEN COALESCE((options->>'timeouts')::int, 0) + 1 > %s THEN 'failed'
                                  ELSE 'pending' END,
                    completed_at = CASE WHEN COALESCE((options->>'timeouts')::int, 0) + 1 > %s
                                        THEN statement_timestamp() END,
                    wake_at = CASE WHEN COALESCE((options->>'timeouts')::int, 0) + 1 > %s THEN NULL
                                   ELSE statement_timestamp() END,
                    options = jsonb_set(options, '{{timeouts}}',
                                        to_jsonb(COALESCE((options->>'timeouts')::int, 0) + 1)),
                    timeout_at = NULL, error = %s
                WHERE status = 'running' AND timeout_at < statement_timestamp() AND run_id IN (
                    SELECT r.id FROM {RUN_TABLE} r
                    WHERE r.id IN (SELECT DISTINCT cp.run_id FROM {CP_TABLE} cp WHERE cp.status = 'running'
                                     AND cp.timeout_at < statement_timestamp() LIMIT %s)
                    ORDER BY length(r.id) DESC, r.id FOR NO KEY UPDATE SKIP LOCKED)
                RETURNING run_id, seq, status, queue""",
            [max_timeouts] * 3 + [error_text, batch],
        )
        rows = cursor.fetchall()
        runs_wake({run_id for run_id, _seq, status, _queue in rows if status == StepStatus.FAILED})
        _dispatch_by_run([(run_id, seq, queue) for run_id, seq, status, queue in rows
                          if status == StepStatus.PENDING])
    return rows


def _dispatch_by_run(steps: Iterable[tuple[str, int, str]]) -> None:
    """Send (run_id, seq, queue) steps again, one message chunk per run and queue, after commit."""
    grouped: dict[tuple[str, str], list[int]] = {}
    for run_id, seq, queue in steps:
        grouped.setdefault((run_id, queue), []).append(seq)
    for (run_id, queue), seqs in grouped.items():
        dispatch_steps(run_id, seqs, queue)


def steps_dispatch_due(*, redispatch_after: float, batch: int) -> list[tuple]:
    """Queued steps of active runs whose retry is due or whose message was never picked up: push their
    next re-dispatch time and send them again after commit. Crash after commit: they are due again
    after `redispatch_after` seconds."""
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            f"""UPDATE {CP_TABLE} SET wake_at = statement_timestamp() + make_interval(secs => %s)
                WHERE id IN (SELECT cp.id FROM {CP_TABLE} cp WHERE cp.status = 'pending' AND cp.queue <> ''
                               AND cp.wake_at <= statement_timestamp()
                               AND EXISTS (SELECT 1 FROM {RUN_TABLE} r WHERE r.id = cp.run_id AND r.status IN {ACTIVE})
                             ORDER BY cp.wake_at LIMIT %s FOR UPDATE SKIP LOCKED)
                RETURNING run_id, seq, queue""",
            [redispatch_after, batch],
        )
        rows = cursor.fetchall()
        _dispatch_by_run(rows)
    return rows


# ------------------------------------------------------------------------------ signals and events


def lock_signal(run_id: str, name: str) -> None:
    # serialises a wait's "buffered signal? else register a waiter" with a send's
    # "waiter? else buffer", so neither can miss the other
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", [f"durable:signal:{run_id}:{name}"])


def lock_event(namespace: str, name: str) -> None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))",
                       [f"durable:event:{namespace}:{name}"])


def signal_take(run_id: str, name: str) -> str | None:
    """Delete the run's oldest buffered signal of that name and return its payload text; None when there
    is none. The caller holds the signal's advisory lock and records the wait in this transaction."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"DELETE FROM {SIGNAL_TABLE} WHERE id = (SELECT id FROM {SIGNAL_TABLE} "
            "WHERE run_id = %s AND name = %s ORDER BY id LIMIT 1 FOR UPDATE) RETURNING payload",
            [run_id, name],
        )
        row = cursor.fetchone()
    return None if row is None else row[0]


def event_take(namespace: str, name: str, match: dict) -> dict | None:
    """Delete the oldest unexpired buffered event of `namespace` and `name` whose payload contains `match`
    and return its payload; None when there is none. The caller holds the event's advisory lock."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"DELETE FROM {EVENT_TABLE} WHERE id = (SELECT id FROM {EVENT_TABLE} "
            "WHERE namespace = %s AND name = %s AND payload @> %s::jsonb "
            "AND expires_at > statement_timestamp() ORDER BY created_at, id LIMIT 1 FOR UPDATE) "
            "RETURNING payload",
            [namespace, name, json.dumps(match)],
        )
        row = cursor.fetchone()
    if row is None:
        return None
    return row[0] if not isinstance(row[0], str) else json.loads(row[0])


def signal_deliver(*, run_id: str, name: str, payload_text: str) -> str:
    """Deliver a signal to the run's oldest waiter of that name (settling its checkpoint and waking
    the run in this transaction); "" when there is none (the caller buffers it). The caller holds
    the signal's advisory lock; the run's row is locked next (the lock order)."""
    if not lock_runs([run_id]):
        return ""
    with connection.cursor() as cursor:
        cursor.execute(
            f"DELETE FROM {WAITER_TABLE} WHERE id = (SELECT id FROM {WAITER_TABLE} "
            "WHERE run_id = %s AND kind = 'signal' AND key = %s ORDER BY seq LIMIT 1) RETURNING seq", [run_id, name],
        )
        waiter = cursor.fetchone()
        if waiter is not None:
            cursor.execute(
                f"UPDATE {CP_TABLE} SET status = 'completed', output = %s, completed_at = statement_timestamp(), "
                "wake_at = NULL WHERE run_id = %s AND seq = %s AND status = 'pending'",
                [payload_text, run_id, waiter[0]],
            )
            if cursor.rowcount == 1:
                run_wake(run_id)
                return "delivered"
        return ""


def event_deliver(*, namespace: str, name: str, payload_json: str, output_text: str) -> int:
    """Settle the checkpoint of every run of `namespace` waiting for this event whose match the
    payload contains, and wake them, in the caller's transaction (which holds the event's advisory
    lock; the runs' rows are locked next). Returns runs reached."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT DISTINCT w.run_id FROM {WAITER_TABLE} w JOIN {RUN_TABLE} r ON r.id = w.run_id "
            "WHERE r.namespace = %s AND w.kind = 'event' AND w.key = %s AND %s::jsonb @> w.match",
            [namespace, name, payload_json],
        )
        waiting = [row[0] for row in cursor.fetchall()]
        if not waiting:
            return 0
        lock_runs(waiting)
        cursor.execute(
            f"""WITH taken AS (
                    DELETE FROM {WAITER_TABLE} AS w
                    WHERE w.run_id = ANY(%s) AND w.kind = 'event' AND w.key = %s AND %s::jsonb @> w.match
                    RETURNING w.run_id, w.seq)
                UPDATE {CP_TABLE} AS cp SET status = 'completed', output = %s, completed_at = statement_timestamp(),
                    wake_at = NULL
                FROM taken WHERE cp.run_id = taken.run_id AND cp.seq = taken.seq AND cp.status = 'pending'
                RETURNING cp.run_id""",
            [waiting, name, payload_json, output_text],
        )
        reached = [row[0] for row in cursor.fetchall()]
    runs_wake(set(reached))
    return len(reached)


# ---------------------------------------------------------------------------------------- attributes


def upsert_attributes(run_id: str, attributes: dict) -> None:
    """Set a run's search attributes (insert or replace, by key). ValueError on a name that is empty or too
    long."""
    # attributes exist to be searched, so they are stored as plain text/JSON, never through the payload codec
    rows = []
    for key, value in attributes.items():
        key = str(key)
        if not key or len(key) > 100:
            raise ValueError(f"attribute names are 1 to 100 characters, not {key[:120]!r}")
        number = float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None
        text = value if isinstance(value, str) else json.dumps(value, cls=DjangoJSONEncoder)
        rows.append((run_id, key, text, number))
    if not rows:
        return
    placeholders = ", ".join(["(%s, %s, %s, %s)"] * len(rows))
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {ATTR_TABLE} (run_id, key, value, value_num) VALUES {placeholders} "
            "ON CONFLICT (run_id, key) DO UPDATE SET value = EXCLUDED.value, value_num = EXCLUDED.value_num",
            [v for row in rows for v in row],
        )


# --------------------------------------------------------------------------------------- operators


def _end_open_work(run_ids: list[str]) -> None:
    """A run ended: its open checkpoints are cancelled (queued steps are never dispatched again) and
    its waiters dropped. In the transaction that ended the runs."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {CP_TABLE} SET status = 'cancelled', completed_at = statement_timestamp(), wake_at = NULL, "
            f"timeout_at = NULL WHERE run_id = ANY(%s) AND status IN {OPEN}", [run_ids],
        )
        cursor.execute(f"DELETE FROM {WAITER_TABLE} WHERE run_id = ANY(%s)", [run_ids])


def descendant_run_ids(run_ids: list[str], *, active_only: bool = False) -> list[str]:
    """Every child, grandchild, ... of the given runs, deepest first, in one recursive query on the
    parent index."""
    status = f"WHERE status IN {ACTIVE}" if active_only else ""
    with connection.cursor() as cursor:
        cursor.execute(
            f"""WITH RECURSIVE tree(id, status, depth) AS (
                    SELECT id, status, 1 FROM {RUN_TABLE} WHERE parent_id = ANY(%s)
                    UNION ALL
                    SELECT r.id, r.status, tree.depth + 1 FROM {RUN_TABLE} r JOIN tree ON r.parent_id = tree.id)
                SELECT id FROM tree {status} ORDER BY depth DESC, id""",
            [run_ids],
        )
        return [row[0] for row in cursor.fetchall()]


CANCEL_SQL = f"""
UPDATE {RUN_TABLE} SET status = 'cancelled', error = %s, ended_at = statement_timestamp(), locked_by = '',
    locked_until = NULL, wake_at = NULL, wake_pending = false, updated_at = statement_timestamp()
WHERE id = ANY(%s) AND status IN {ACTIVE}
RETURNING id, parent_id, parent_seq, workflow, input, namespace, tags
"""


def runs_cancel_tree(run_id: str, *, error_text: str, descendant_error_text: str, root: bool = True) -> tuple | None:
    """Cancel a run (when `root`) and its active descendants: a compare-and-set on their status that
    also clears the lease, so a turn still running there finds its writes refused (it can neither
    checkpoint nor start children). Descendants are locked leaf first, then the root. Open
    checkpoints are cancelled and waiters dropped in the same transaction; a cancelled child
    reports to its parent. Returns the root's (parent_id, parent_seq, workflow, input, namespace,
    tags), or None when it was not active (with `root=False`: the ended run's own row is untouched)."""
    with transaction.atomic(), connection.cursor() as cursor:
        _lock_descendants(run_id)
        row = None
        if root:
            cursor.execute(CANCEL_SQL, [error_text, [run_id]])
            row = cursor.fetchone()
            if row is None:
                return None
        # children created before the locks were taken are visible now
        descendants = descendant_run_ids([run_id], active_only=True)
        ended = [run_id] if root else []
        if descendants:
            ended += _cancel_runs(descendants, descendant_error_text)
        if ended:
            _end_open_work(ended)
        if row is not None and row[1]:
            child_report(parent_id=row[1], parent_seq=row[2], child_id=run_id, child_status=RunStatus.CANCELLED,
                         output_text="", error_text=error_text)
    return row[1:] if row is not None else ()


RETRY_FIELDS = ("status = 'pending', output = '', error = '', ended_at = NULL, recovery_attempts = 0, "
                "fence = fence + 1, wake_pending = true, dispatched_at = statement_timestamp(), wake_at = NULL, "
                "locked_by = '', locked_until = NULL, updated_at = statement_timestamp()")


def run_retry(run_id: str, *, input_text: str | None = None) -> int | None:
    """Run a failed, cancelled or dead run again (with `input_text`: from the start with new input).

    A plain retry keeps the completed checkpoints a replay reaches unchanged (those before the first that
    did not complete, and the completed items of its fan) and drops the rest, and retries the run's failed,
    cancelled or dead descendants the same way, so the whole tree resumes where it stopped (a child
    that ended meanwhile settles its parent's checkpoint when the parent replays). New input starts
    a new history (epoch + 1): every checkpoint is deleted and children start afresh with new ids.
    Crash after commit: the runs are pending with wake_pending; the lost-wake pass sends their turns.
    Returns the run's priority, or None when it was not retryable."""
    retryable = _sql_list(RunStatus.RETRYABLE)
    with transaction.atomic(), connection.cursor() as cursor:
        fields = RETRY_FIELDS
        params: list = []
        if input_text is not None:
            fields += ", input = %s, epoch = epoch + 1, turns = 0"
            params.append(input_text)
        cursor.execute(f"UPDATE {RUN_TABLE} SET {fields} WHERE id = %s AND status IN {retryable} "
                       "RETURNING priority", [*params, run_id])
        row = cursor.fetchone()
        if row is None:
            return None
        retried = [(run_id, row[0])]
        if input_text is not None:
            cursor.execute(f"DELETE FROM {CP_TABLE} WHERE run_id = %s", [run_id])
        else:
            # the descendants that stopped with it: retryable children of retried runs, recursively (a child
            # under a completed run is not waited for by anyone, so it stays as it is)
            cursor.execute(
                f"""WITH RECURSIVE tree(id) AS (
                        SELECT id FROM {RUN_TABLE} WHERE parent_id = %s AND status IN {retryable}
                        UNION ALL
                        SELECT r.id FROM {RUN_TABLE} r JOIN tree ON r.parent_id = tree.id WHERE r.status IN {retryable})
                    UPDATE {RUN_TABLE} SET {RETRY_FIELDS} WHERE id IN (SELECT id FROM tree) RETURNING id, priority""",
                [run_id],
            )
            retried += cursor.fetchall()
            # keep what a replay reaches unchanged: completed checkpoints before the first one that is not
            # (and the completed items of that one's fan); what came after it was decided by its outcome. What
            # is kept belongs to the new history: stamped with the new fence in the same statement (one
            # snapshot), so a late write of a turn of the old history committed after it keeps the old fence
            # and is dropped by the next replay
            cursor.execute(
                f"""WITH first_open AS (
                        SELECT run_id, min(seq) AS seq FROM {CP_TABLE}
                        WHERE run_id = ANY(%s) AND status <> 'completed' GROUP BY run_id),
                    fan AS (
                        SELECT f.run_id, f.seq, cp.parallel_group AS grp FROM first_open f
                        JOIN {CP_TABLE} cp ON cp.run_id = f.run_id AND cp.seq = f.seq),
                    pruned AS (
                        DELETE FROM {CP_TABLE} AS cp USING fan
                        WHERE cp.run_id = fan.run_id AND cp.seq >= fan.seq
                          AND (cp.status <> 'completed' OR fan.grp IS NULL
                               OR cp.parallel_group IS DISTINCT FROM fan.grp)
                        RETURNING cp.id)
                    UPDATE {CP_TABLE} AS cp SET fence = r.fence FROM {RUN_TABLE} r
                    WHERE r.id = ANY(%s) AND cp.run_id = r.id AND cp.fence <> r.fence
                      AND cp.id NOT IN (SELECT id FROM pruned)""",
                [[rid for rid, _ in retried]] * 2,
            )
        cursor.execute(f"DELETE FROM {WAITER_TABLE} WHERE run_id = ANY(%s)", [[rid for rid, _ in retried]])
        for rid, priority in retried:
            dispatch_turn(rid, priority)
    return row[0]


# -------------------------------------------------------------------------------------------- tick


def runs_recover_expired(*, max_attempts: int, dead_error_text: str, batch: int) -> list[tuple]:
    """Running runs whose lease expired (their worker died or stalled): count a recovery attempt
    and suspend them with a wake, or mark them dead past `max_attempts` (their open work ended, the
    parent told, then their active children cancelled). Crash after commit: recovered runs have
    wake_pending (the lost-wake pass); a dead run's children are found by the orphan sweep."""
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            f"""UPDATE {RUN_TABLE} SET recovery_attempts = recovery_attempts + 1, locked_by = '', locked_until = NULL,
                    status = CASE WHEN recovery_attempts + 1 > %s THEN 'dead' ELSE 'suspended' END,
                    error = CASE WHEN recovery_attempts + 1 > %s THEN %s ELSE error END,
                    ended_at = CASE WHEN recovery_attempts + 1 > %s THEN statement_timestamp() ELSE ended_at END,
                    wake_pending = (recovery_attempts + 1 <= %s), dispatched_at = statement_timestamp(),
                    updated_at = statement_timestamp()
                WHERE id IN (SELECT id FROM {RUN_TABLE}
                             WHERE status = 'running' AND locked_until < statement_timestamp()
                             ORDER BY locked_until LIMIT %s FOR UPDATE SKIP LOCKED)
                RETURNING id, status, priority, parent_id, parent_seq""",
            [max_attempts, max_attempts, dead_error_text, max_attempts, max_attempts, batch],
        )
        rows = cursor.fetchall()
        dead = [row[0] for row in rows if row[1] == RunStatus.DEAD]
        if dead:
            _end_open_work(dead)
        for run_id, status, priority, parent_id, parent_seq in rows:
            if status == RunStatus.DEAD:
                if parent_id:
                    child_report(parent_id=parent_id, parent_seq=parent_seq, child_id=run_id, child_status=status,
                                 output_text="", error_text=dead_error_text)
            else:
                dispatch_turn(run_id, priority)
    for run_id in dead:
        close_children(run_id)
    return rows


def runs_resume_due(*, batch: int) -> list[tuple]:
    """Suspended runs whose timer is due (sleeps, wait timeouts, inline retries), oldest first: flag
    a wake and send a turn after commit. Crash after commit: the lost-wake pass re-sends."""
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            f"""UPDATE {RUN_TABLE} SET wake_pending = true, wake_at = NULL, dispatched_at = statement_timestamp(),
                    updated_at = statement_timestamp()
                WHERE id IN (SELECT id FROM {RUN_TABLE} WHERE status = 'suspended' AND wake_at <= statement_timestamp()
                             ORDER BY wake_at LIMIT %s FOR UPDATE SKIP LOCKED)
                RETURNING id, priority""",
            [batch],
        )
        rows = cursor.fetchall()
        for run_id, priority in rows:
            dispatch_turn(run_id, priority)
    return rows


def runs_redispatch_lost(*, after_seconds: float, batch: int) -> list[tuple]:
    """Runs that want a turn whose message was lost (a broker restart, a crash between a commit and
    its send): send it again."""
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            f"""UPDATE {RUN_TABLE} SET dispatched_at = statement_timestamp()
                WHERE id IN (SELECT id FROM {RUN_TABLE} WHERE wake_pending
                               AND dispatched_at < statement_timestamp() - make_interval(secs => %s)
                               AND status IN ('pending', 'suspended')
                             ORDER BY dispatched_at LIMIT %s FOR UPDATE SKIP LOCKED)
                RETURNING id, priority""",
            [after_seconds, batch],
        )
        rows = cursor.fetchall()
        for run_id, priority in rows:
            dispatch_turn(run_id, priority)
    return rows


def runs_cancel_orphans(*, batch: int = 500) -> int:
    """Active runs whose parent has ended (a crash between a parent's death and the cancel of its
    children): cancel them with their descendants. Safe to race (each cancel is a compare-and-set)."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT c.id, p.id FROM {RUN_TABLE} c JOIN {RUN_TABLE} p ON p.id = c.parent_id "
            f"WHERE c.status IN {ACTIVE} AND p.status IN {_sql_list(RunStatus.TERMINAL)} LIMIT %s", [batch],
        )
        orphans = cursor.fetchall()
    cancelled = 0
    for child_id, parent_id in orphans:
        if runs_cancel_tree(child_id, error_text=_parent_ended_error(parent_id),
                            descendant_error_text=_parent_ended_error(child_id)) is not None:
            cancelled += 1
    return cancelled


# --------------------------------------------------------------------------------------- retention


def runs_delete(run_ids: list[str], *, chunk: int = 500) -> int:
    """Delete terminal runs and everything hanging off them, `chunk` ids a transaction, cascading
    by explicit deletes. Active runs in the list are left alone. A crash between chunks leaves
    whole chunks deleted or kept."""
    terminal = sorted(RunStatus.TERMINAL)
    deleted = 0
    for start in range(0, len(run_ids), chunk):
        ids_chunk = run_ids[start:start + chunk]
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(f"SELECT id FROM {RUN_TABLE} WHERE id = ANY(%s) AND status = ANY(%s) FOR UPDATE",
                           [ids_chunk, terminal])
            ids = [row[0] for row in cursor.fetchall()]
            if not ids:
                continue
            for table in (CP_TABLE, WAITER_TABLE, SIGNAL_TABLE, ATTR_TABLE):
                cursor.execute(f"DELETE FROM {table} WHERE run_id = ANY(%s)", [ids])
            cursor.execute(f"DELETE FROM {RUN_TABLE} WHERE id = ANY(%s)", [ids])
            deleted += cursor.rowcount
    return deleted

"""Retention: delete terminal runs past their policy, and prune expired buffered events.

A policy is {"statuses": [...terminal statuses], "max_age_days": N and/or "max_count": N,
optionally "workflow": name}. Only terminal runs are ever selected. Each chunk of 500 ids
is deleted in one transaction, cascading by explicit ``IN (...)`` deletes (checkpoints,
waiters, buffered signals, attributes, then the runs), so a chunk goes whole or not at all.
"""

from __future__ import annotations

import logging

from django.core.exceptions import ImproperlyConfigured
from django.db import connection

from durable import store
from durable.models import DurableRun
from durable.settings import durable_settings

logger = logging.getLogger("durable.retention")

CHUNK = 500
TERMINAL = sorted(DurableRun.Status.TERMINAL)


def delete_runs(run_ids: list[str]) -> int:
    """Delete runs and everything hanging off them, in chunks of 500 ids, one transaction a chunk.
    Active runs in the list are left alone."""
    return store.runs_delete(run_ids, chunk=CHUNK)


POLICY_KEYS = ("statuses", "max_age_days", "max_count", "workflow")
# what the passes' statements can take: now minus that many days stays a timestamp, an OFFSET a bigint
MAX_AGE_DAYS = 1_000_000
MAX_COUNT = 2**63 - 1


def policy_validate(policy) -> tuple[list[str], int | None, int | None, str | None]:
    """A policy's statuses, age, count and workflow; ImproperlyConfigured naming the field that is wrong
    (the start-up check of config/checks.py runs it on every configured policy)."""
    if not isinstance(policy, dict) or set(policy) - set(POLICY_KEYS):
        raise ImproperlyConfigured(f"a policy is an object with the keys {', '.join(POLICY_KEYS)} only")
    statuses = policy.get("statuses")
    if not isinstance(statuses, list) or not statuses or any(status not in DurableRun.Status.TERMINAL
                                                            for status in statuses):
        raise ImproperlyConfigured(f"statuses must be a list of terminal statuses ({', '.join(TERMINAL)}), "
                                   f"got {statuses!r}")
    age, count = policy.get("max_age_days"), policy.get("max_count")
    if age is None and count is None:
        raise ImproperlyConfigured("max_age_days and/or max_count is required")
    for name, value, most in (("max_age_days", age, MAX_AGE_DAYS), ("max_count", count, MAX_COUNT)):
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= most):
            raise ImproperlyConfigured(f"{name} must be a whole number from 0 to {most}, got {value!r}")
    workflow = policy.get("workflow")
    if workflow is not None and not (isinstance(workflow, str) and workflow):
        raise ImproperlyConfigured(f"workflow must be a workflow's name, got {workflow!r}")
    return statuses, age, count, workflow


def apply_policy(policy: dict, *, max_chunks: int = 20) -> int:
    statuses, age, count, workflow = policy_validate(policy)
    deleted = 0
    for _ in range(max_chunks):
        params: list
        conditions, params = ["status = ANY(%s)"], [statuses]
        if workflow:
            conditions.append("workflow = %s")
            params.append(workflow)
        where = " AND ".join(conditions)
        queries = []
        if age is not None:
            queries.append((f"SELECT id FROM {store.RUN_TABLE} WHERE {where} "
                            "AND ended_at < statement_timestamp() - make_interval(days => %s) ORDER BY ended_at LIMIT %s",
                            [*params, int(age), CHUNK]))
        if count is not None:
            queries.append((f"SELECT id FROM {store.RUN_TABLE} WHERE {where} "
                            "ORDER BY ended_at DESC NULLS LAST, id DESC OFFSET %s LIMIT %s",
                            [*params, int(count), CHUNK]))
        ids: set[str] = set()
        with connection.cursor() as cursor:
            for sql, query_params in queries:
                cursor.execute(sql, query_params)
                ids.update(row[0] for row in cursor.fetchall())
        if not ids:
            break
        deleted += delete_runs(sorted(ids))
    return deleted


def prune_buffered_events(*, batch: int = 5000) -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            f"DELETE FROM {store.EVENT_TABLE} WHERE id IN (SELECT id FROM {store.EVENT_TABLE} "
            "WHERE expires_at < statement_timestamp() ORDER BY expires_at LIMIT %s)", [batch],
        )
        return cursor.rowcount


def retention_pass() -> dict[str, int | str]:
    """Apply every configured policy, cancel orphaned runs (active children of ended parents), then prune
    expired buffered events; each step reports its own error."""
    report: dict[str, int | str] = {}
    for index, policy in enumerate(durable_settings().retention_policies):
        try:
            report[f"policy_{index}"] = apply_policy(policy)
        except Exception as exc:
            logger.exception("durable: retention policy %s failed", policy)
            report[f"policy_{index}"] = f"error: {exc}"
    try:
        report["orphans_cancelled"] = store.runs_cancel_orphans()
    except Exception as exc:
        logger.exception("durable: cancelling orphaned runs failed")
        report["orphans_cancelled"] = f"error: {exc}"
    try:
        report["buffered_events"] = prune_buffered_events()
    except Exception as exc:
        logger.exception("durable: pruning buffered events failed")
        report["buffered_events"] = f"error: {exc}"
    return report

"""Database connections across `fork()`.

A forked child inherits its parent's open sockets: the connection Django's thread holds and every idle
connection in the process's psycopg pool (Django keeps the pools in a class-level dict). Had the child
used them, two processes would write statements and read results on one socket, each reading the
other's answers (`multiprocessing` pools, Celery's prefork pool, any `os.fork()`). Closing them in the
child is no better: `close()` sends libpq's Terminate message, which ends the parent's session too.

So, after every fork, the child forgets them: Django's connections and pools start afresh, and the
inherited objects are kept referenced, never closed (psycopg finishes a connection on garbage collection
only in the process that opened it; a pool collected in the child would stop worker threads the child does
not have). Registered once per process by `ConfigAppConfig.ready()`; billiard (Celery) forks with
`os.fork()`, so its pool processes are covered too.
"""

from __future__ import annotations

import os

_inherited: list[object] = []
_registered = False


def forget_inherited_connections() -> None:
    """In a forked child: drop the parent's connections and pools without any I/O on their sockets."""
    from django.db import connections
    from django.db.backends.postgresql.base import DatabaseWrapper

    for wrapper in connections.all(initialized_only=True):
        if wrapper.connection is not None:
            _inherited.append(wrapper.connection)
            wrapper.connection = None  # the next query connects (connect() resets the transaction state)
    _inherited.extend(DatabaseWrapper._connection_pools.values())
    DatabaseWrapper._connection_pools.clear()


def register_fork_safety() -> None:
    global _registered
    if not _registered:
        os.register_at_fork(after_in_child=forget_inherited_connections)
        _registered = True

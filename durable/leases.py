"""Turn leases: the token a turn writes under, and one thread per process that renews them.

A turn holds its run's lease (``locked_by`` = its token, ``locked_until``). A long inline step
never lets it lapse while the worker is alive: the keeper renews every held lease at a third
of its length. A renewal that finds the lease gone (the run was cancelled, or recovered after
a stall) marks it lost, and the turn stops at its next ``ctx`` call instead of writing on.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid

from durable.settings import durable_settings

logger = logging.getLogger("durable.engine")


def worker_token() -> str:
    """A lease token that never repeats: host, pid and a random part."""
    return f"{socket.gethostname()[:40]}:{os.getpid()}:{uuid.uuid4().hex[:12]}"


class LeaseKeeper:
    def __init__(self):
        self._held: dict[str, str] = {}
        self._lost: set[str] = set()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._pid = os.getpid()

    def hold(self, run_id: str, token: str) -> None:
        with self._lock:
            self._held[run_id] = token
            self._lost.discard(token)
            if self._thread is None or not self._thread.is_alive() or self._pid != os.getpid():
                self._pid = os.getpid()
                self._thread = threading.Thread(target=self._loop, name="durable-lease-keeper", daemon=True)
                self._thread.start()

    def release(self, run_id: str) -> None:
        with self._lock:
            token = self._held.pop(run_id, None)
            self._lost.discard(token)

    def lost(self, token: str) -> bool:
        return token in self._lost

    def renew(self) -> None:
        from durable import store

        with self._lock:
            held = dict(self._held)
        if not held:
            return
        renewed = store.runs_renew_leases(held, durable_settings().lease_seconds)
        with self._lock:
            for run_id, token in held.items():
                if run_id not in renewed and self._held.get(run_id) == token:
                    self._lost.add(token)

    def _loop(self) -> None:
        from django.db import connection as thread_connection

        while True:
            time.sleep(max(0.5, durable_settings().lease_seconds / 3))
            try:
                self.renew()
            except Exception:
                logger.exception("durable: lease renewal failed")
                thread_connection.close()


lease_keeper = LeaseKeeper()

"""Leases and silence clocks kept alive while this process is: one keeper thread per process.

A turn holds its run's lease (``locked_by`` = its token, ``locked_until``). A long inline step
never lets it lapse while the worker is alive: the keeper renews every held lease at a third
of its length. A renewal that finds the lease gone (the run was cancelled, or recovered after
a stall) marks it lost, and the turn stops at its next ``ctx`` call instead of writing on.

A queued-step worker claims a chunk of steps at once and runs them one after another. The
steps of the chunk that are not running (still queued, or finished with their result not yet
saved) are not silent while this process lives, so the keeper re-arms their silence clocks
(with a grace of one keeper period, so a step starts with its whole allowance). The running
step's clock is re-armed only by its own heartbeats. A killed worker stops the keeper too:
every clock then runs out and the tick hands the steps to another worker.
"""

from __future__ import annotations

import itertools
import logging
import os
import socket
import threading
import time
import uuid
from dataclasses import dataclass, field

from durable import store
from durable.settings import durable_settings

logger = logging.getLogger("durable.engine")


def worker_token() -> str:
    """A lease token that never repeats: host, pid and a random part."""
    return f"{socket.gethostname()[:40]}:{os.getpid()}:{uuid.uuid4().hex[:12]}"


@dataclass
class ChunkClocks:
    """The steps of one claimed chunk whose clocks the keeper re-arms: (id, attempt) by id."""

    period: float
    kept: bool = True
    waiting: dict = field(default_factory=dict)
    held: set = field(default_factory=set)
    rearmed_at: float = field(default_factory=time.monotonic)


class Keeper:
    def __init__(self):
        self._held: dict[str, str] = {}
        self._lost: set[str] = set()
        self._chunks: dict[int, ChunkClocks] = {}
        self._ids = itertools.count()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._pid = os.getpid()
        self._wakeup = threading.Event()

    def _ensure_thread(self) -> None:
        if self._thread is None or not self._thread.is_alive() or self._pid != os.getpid():
            self._pid = os.getpid()
            self._thread = threading.Thread(target=self._loop, name="durable-keeper", daemon=True)
            self._thread.start()

    # -- turn leases

    def hold(self, run_id: str, token: str) -> None:
        with self._lock:
            self._held[run_id] = token
            self._lost.discard(token)
            self._ensure_thread()

    def release(self, run_id: str) -> None:
        with self._lock:
            token = self._held.pop(run_id, None)
            self._lost.discard(token)

    def lost(self, token: str) -> bool:
        return token in self._lost

    def renew(self) -> None:
        with self._lock:
            held = dict(self._held)
        if not held:
            return
        renewed = store.runs_renew_leases(held, durable_settings().lease_seconds)
        with self._lock:
            for run_id, token in held.items():
                if run_id not in renewed and self._held.get(run_id) == token:
                    self._lost.add(token)

    # -- chunk clocks

    def hold_chunk(self, steps: list[tuple[int, int]], period: float, *, kept: bool = True) -> int:
        """Start keeping the clocks of a claimed chunk's steps ((id, attempt) pairs); returns its key.
        With `kept=False` the chunk is only tracked (its claim is not visible to other connections yet)."""
        with self._lock:
            key = next(self._ids)
            self._chunks[key] = ChunkClocks(period=period, kept=kept, waiting=dict(steps),
                                            held={step for step, _ in steps})
            self._ensure_thread()
        self._wakeup.set()
        return key

    def chunk_start(self, key: int, step_id: int) -> bool:
        """A step starts: its clock is its own from now (its heartbeats re-arm it). Returns whether the
        step is still held (a step that timed out before the keeper reached it belongs to another worker)."""
        with self._lock:
            chunk = self._chunks[key]
            chunk.waiting.pop(step_id, None)
            return step_id in chunk.held

    def chunk_waiting(self, key: int, step_id: int, attempt: int) -> None:
        """A step finished: its result waits to be saved, so its clock is kept again."""
        with self._lock:
            self._chunks[key].waiting[step_id] = attempt

    def chunk_saved(self, key: int, step_ids) -> None:
        with self._lock:
            chunk = self._chunks[key]
            for step_id in step_ids:
                chunk.waiting.pop(step_id, None)

    def release_chunk(self, key: int) -> None:
        with self._lock:
            self._chunks.pop(key, None)

    def rearm_chunks(self) -> None:
        now = time.monotonic()
        with self._lock:
            due = {key: (dict(chunk.waiting), chunk.period) for key, chunk in self._chunks.items()
                   if chunk.kept and chunk.waiting and now - chunk.rearmed_at >= chunk.period / 2}
        for key, (waiting, period) in due.items():
            still = store.steps_rearm(list(waiting.items()), grace_seconds=period)
            with self._lock:
                chunk = self._chunks.get(key)
                if chunk is not None:
                    chunk.held -= set(waiting) - still
                    chunk.rearmed_at = now

    def _sleep_seconds(self) -> float:
        with self._lock:
            periods = [chunk.period / 2 for chunk in self._chunks.values() if chunk.kept]
        return max(0.1, min([durable_settings().lease_seconds / 3, *periods]))

    def _loop(self) -> None:
        from django.db import connection as thread_connection

        last_renewal = 0.0
        while True:
            self._wakeup.wait(self._sleep_seconds())
            self._wakeup.clear()
            try:
                if time.monotonic() - last_renewal >= durable_settings().lease_seconds / 3:
                    last_renewal = time.monotonic()
                    self.renew()
                self.rearm_chunks()
            except Exception:
                logger.exception("durable: renewing leases or step clocks failed")
                thread_connection.close()
                continue
            with self._lock:
                idle = not self._held and not self._chunks
            if idle:  # hold no database session while there is nothing to keep
                thread_connection.close()


keeper = Keeper()
lease_keeper = keeper  # the name the turn code uses

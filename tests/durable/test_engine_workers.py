"""The engine with real Celery worker subprocesses: crashes lose nothing."""

import os
import signal
import subprocess
import sys
import time
from urllib.parse import urlsplit, urlunsplit

import pytest
from django.conf import settings
from django.db import connection

from config.supervisor import BASE_DIR, stop_process_groups
from durable import tick
from durable.codec import decode
from durable.models import DurableRun, StepCheckpoint
from durable.services import run_start

pytestmark = [pytest.mark.worker, pytest.mark.django_db(transaction=True)]


def _test_database_url() -> str:
    parts = urlsplit(os.environ["DATABASE_URL"])
    return urlunsplit(parts._replace(path="/" + connection.settings_dict["NAME"]))


class Worker:
    def __init__(self, name: str):
        env = {
            **os.environ,
            "DATABASE_URL": _test_database_url(),
            "DURABLE_WORKFLOW_MODULES": "tests.durable.workflows",
            "DURABLE_LEASE_SECONDS": "2",
            "DURABLE_STEP_DEFAULT_TIMEOUT": "3",
        }
        self.process = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "config", "worker", "-Q", "turns,steps", "-c", "1",
             "--pool", "prefork", "--without-gossip", "--without-mingle", "--without-heartbeat",
             "-n", f"{name}@%h", "--loglevel", "WARNING"],
            cwd=BASE_DIR, env=env, start_new_session=True,
        )

    def kill(self):
        os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(10)

    def stop(self):
        stop_process_groups([self.process], timeout=20)


@pytest.fixture
def workers():
    started = []

    def start(name):
        worker = Worker(name)
        started.append(worker)
        return worker

    yield start
    for worker in started:
        worker.stop()


@pytest.fixture(autouse=True)
def _short_lease(settings):
    settings.DURABLE_LEASE_SECONDS = 2
    settings.DURABLE_STEP_DEFAULT_TIMEOUT = 3


def _wait_for(predicate, timeout=60.0, tick_every=0.3):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        tick.tick()
        time.sleep(tick_every)
    return False


def test_a_run_survives_a_worker_killed_mid_run(workers, tmp_path):
    evidence = tmp_path / "executions.log"
    first = workers("first")
    run = run_start(workflow="tests.durable_file", input={"steps": 8, "path": str(evidence), "pause": 0.4})

    def some_steps_done():
        return StepCheckpoint.objects.filter(run_id=run.id, status="completed").count() >= 3

    assert _wait_for(some_steps_done, tick_every=0.1), "the first worker never made progress"
    first.kill()
    done_before_crash = set(StepCheckpoint.objects.filter(run_id=run.id).values_list("seq", flat=True))
    assert DurableRun.objects.get(pk=run.id).status == "running"  # the crash left a lease behind

    workers("second")
    assert _wait_for(lambda: DurableRun.objects.get(pk=run.id).status == "completed"), "the run never completed"

    run = DurableRun.objects.get(pk=run.id)
    assert run.recovery_attempts >= 1
    checkpoints = list(StepCheckpoint.objects.filter(run=run).values_list("seq", "status"))
    assert sorted(seq for seq, _ in checkpoints) == list(range(8))  # every step checkpointed exactly once
    assert all(status == "completed" for _, status in checkpoints)
    executions = evidence.read_text().split()
    for seq in done_before_crash:
        # a step completed before the crash was never executed again
        assert executions.count(str(seq)) == 1
    assert decode(run.output)["pid"] != first.process.pid


def test_runs_whose_turns_a_killed_worker_had_reserved_are_finished_by_the_next(workers, tmp_path, settings,
                                                                               monkeypatch):
    """A worker holds the turn it runs and a message it reserved beyond it: killed, both are lost with it (the
    broker keeps no copy); the tick sends the turns again from the runs' rows and the next worker ends every run,
    each step of those that had not started run once."""
    settings.DURABLE_REDISPATCH_AFTER_SECONDS = 2
    monkeypatch.setenv("CELERY_WORKER_PREFETCH_MULTIPLIER", "2")  # its one process reserves a second turn
    first = workers("first")
    runs = [run_start(workflow="tests.durable_file", input={"steps": 6, "path": str(tmp_path / f"run{index}.log"),
                                                            "pause": 0.3}) for index in range(3)]

    def started(run):
        return StepCheckpoint.objects.filter(run_id=run.id, status="completed").exists()

    assert _wait_for(lambda: any(started(run) for run in runs), tick_every=0.1), "the first worker never started"
    first.kill()
    waiting = [index for index, run in enumerate(runs) if not started(run)]
    assert len(waiting) == 2  # one turn was running; of the others, one was reserved by the worker
    workers("second")
    assert _wait_for(lambda: all(DurableRun.objects.get(pk=run.id).status == "completed" for run in runs)), \
        [DurableRun.objects.get(pk=run.id).status for run in runs]
    for index in waiting:
        done = [entry for entry in (tmp_path / f"run{index}.log").read_text().split() if not entry.startswith("start")]
        assert done == [str(seq) for seq in range(6)]


def test_queued_steps_and_fans_run_on_workers(workers):
    workers("one")
    workers("two")
    run = run_start(workflow="tests.fan", input={"n": 200})
    assert _wait_for(lambda: DurableRun.objects.get(pk=run.id).status in DurableRun.Status.TERMINAL)
    run = DurableRun.objects.get(pk=run.id)
    assert run.status == "completed", run.error
    assert decode(run.output) == sum(i * i for i in range(200))
    assert StepCheckpoint.objects.filter(run=run, attempt=1, status="completed").count() == 200


def test_a_queued_step_lost_with_its_worker_is_run_again(workers, tmp_path):
    evidence = tmp_path / "slow.log"
    first = workers("first")
    run = run_start(workflow="tests.queued_slow", input={"path": str(evidence)})
    assert _wait_for(lambda: evidence.exists() and "start:x" in evidence.read_text(), tick_every=0.1)
    first.kill()
    workers("second")
    assert _wait_for(lambda: DurableRun.objects.get(pk=run.id).status == "completed", timeout=60)
    step = StepCheckpoint.objects.get(run_id=run.id, seq=0)
    assert step.attempt == 2 and step.options["timeouts"] == 1
    assert evidence.read_text().split().count("start:x") == 2


def test_a_worker_process_keeps_its_pooled_database_sessions_from_task_to_task(workers):
    workers("one")  # one prefork process: every turn and step of the run is one of its tasks
    run = run_start(workflow="tests.sessions", input={"steps": 8})
    assert _wait_for(lambda: DurableRun.objects.get(pk=run.id).status in DurableRun.Status.TERMINAL)
    run = DurableRun.objects.get(pk=run.id)
    assert run.status == "completed", run.error
    sessions = decode(run.output)
    # 16 tasks (8 steps, 8 turns) on sessions of the process's pool, not a new session for each
    assert len(set(sessions)) <= settings.DATABASE_POOL_MAX_SIZE, sessions

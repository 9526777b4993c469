"""The Celery application and the one place periodic work is declared."""

import os

from celery import Celery
from celery.signals import beat_init, task_postrun, task_prerun, worker_init, worker_process_init

from config.logging import bind_task, unbind_task

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

app = Celery("lineage")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


@task_prerun.connect
@task_postrun.connect
def _give_back_connections(sender=None, **kwargs):
    """A task's database connection goes back to the process's pool (a broken one is dropped), and the pool
    stays open for the next task (settings: CELERY_DB_REUSE_MAX). An eager task runs in its caller's
    connection, which is not the task's to give back."""
    if getattr(getattr(sender, "request", None), "is_eager", False):
        return
    from django.db import close_old_connections

    close_old_connections()


# every log line of a task says which task (config/logging.py)
task_prerun.connect(bind_task)
task_postrun.connect(unbind_task)

# Each entry: what it does and why it runs at that pace.
app.conf.beat_schedule = {
    # the durable engine's heartbeat: due timers, expired leases, step retries and timeouts, schedules
    "durable-tick": {"task": "durable.tick", "schedule": 1.0, "options": {"expires": 5}},
    # retention policies and buffered-event pruning do not need to be any faster than this
    "durable-retention": {"task": "durable.retention", "schedule": 60.0, "options": {"expires": 50}},
    # rows a durable run drives (invocations, eval runs, evolution runs) whose run was cancelled, declared dead
    # or deleted elsewhere take its end: a run ends its row itself, so this is a backstop and 30 s is soon enough
    "durable-reconcile": {"task": "durable.reconcile", "schedule": 30.0, "options": {"expires": 25}},
}


@worker_init.connect
def _load_provider_libraries(**kwargs):
    """The model providers' client library is imported as the worker starts, not by its first calls."""
    from llm.chat import load_provider_libraries

    load_provider_libraries()


# OpenTelemetry (config/telemetry.py, off unless configured), once a process that runs tasks: each prefork
# (and solo) process after it is forked, so its batch exporter has its own thread; a threads pool's one
# process as it starts (no worker_process_init there); beat. Each serves Prometheus's scrapes, when they
# are configured, on the port of its kind (decided as the worker starts, before it forks) and pool index.
_worker_kind = "worker"


@worker_process_init.connect
def _telemetry_in_worker_process(**kwargs):
    from billiard.process import current_process

    from config import telemetry

    index = getattr(current_process(), "index", 0)
    telemetry.setup(instrument=("celery", "psycopg"), scrape_port=telemetry.scrape_port(_worker_kind, index))


@worker_init.connect
def _telemetry_as_the_worker_starts(sender=None, **kwargs):
    global _worker_kind
    _worker_kind = _kind_of(sender)
    if "thread" in str(getattr(sender, "pool_cls", "")).lower():
        from config import telemetry

        telemetry.setup(instrument=("celery", "psycopg"), scrape_port=telemetry.scrape_port(_worker_kind))


def _kind_of(worker) -> str:
    """"tick" or "llm" for a worker that serves only that queue (or runs a threads pool: model calls), else
    "worker" (config.telemetry.SCRAPE_PORT_OFFSETS)."""
    from django.conf import settings

    queues = set(worker.app.amqp.queues.consume_from)
    if queues == {settings.DURABLE_TICK_QUEUE}:
        return "tick"
    if queues == {settings.LLM_QUEUE} or "thread" in str(getattr(worker, "pool_cls", "")).lower():
        return "llm"
    return "worker"


@beat_init.connect
def _telemetry_in_beat(**kwargs):
    from config import telemetry

    telemetry.setup(instrument=("celery",), scrape_port=telemetry.scrape_port("beat"))

"""The Celery application and the one place periodic work is declared."""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

app = Celery("lineage")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()

# Each entry: what it does and why it runs at that pace.
app.conf.beat_schedule = {
    # the durable engine's heartbeat: due timers, expired leases, step retries and timeouts, schedules
    "durable-tick": {"task": "durable.tick", "schedule": 1.0, "options": {"expires": 5}},
    # retention policies and buffered-event pruning do not need to be any faster than this
    "durable-retention": {"task": "durable.retention", "schedule": 60.0, "options": {"expires": 50}},
    # workflow invocations whose durable run was cancelled or declared dead elsewhere take its end
    "workflows-reconcile": {"task": "workflows.reconcile", "schedule": 30.0, "options": {"expires": 25}},
    "evals-reconcile": {"task": "evals.reconcile", "schedule": 30.0, "options": {"expires": 25}},
    "evolution-reconcile": {"task": "evolution.reconcile", "schedule": 30.0, "options": {"expires": 25}},
}

"""The Celery application and the one place periodic work is declared."""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

app = Celery("lineage")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()

# Each entry: what it does and why it runs at that pace.
app.conf.beat_schedule = {}

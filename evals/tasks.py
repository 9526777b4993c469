"""Celery entry points of the evals app."""

from celery import shared_task

from durable import owners
from evals.models import EvalRun


@shared_task(name="evals.reconcile", ignore_result=True)
def reconcile() -> int:
    """Beat, every 30 s: eval runs whose durable run ended without them take its end
    (durable.owners.reconcile). Safe to race (each end is conditional)."""
    return owners.reconcile(of=[EvalRun])[EvalRun._meta.label]

"""Celery entry points of the workflows app."""

from celery import shared_task

from durable import owners
from workflows.models import WorkflowInvocation


@shared_task(name="workflows.reconcile", ignore_result=True)
def reconcile() -> int:
    """Beat, every 30 s: invocations whose durable run ended without them take its end
    (durable.owners.reconcile). Safe to race (each end is conditional)."""
    return owners.reconcile(of=[WorkflowInvocation])[WorkflowInvocation._meta.label]

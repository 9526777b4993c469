"""Celery entry points of the workflows app."""

from celery import shared_task

from workflows.execution import invocations_reconcile


@shared_task(name="workflows.reconcile", ignore_result=True)
def reconcile() -> int:
    """Beat, every 30 s: invocations whose durable run was cancelled, declared dead or deleted
    outside the workflows app take their run's end. Safe to race (each update is conditional)."""
    return invocations_reconcile()

"""Celery entry points of the workflows app."""

from celery import shared_task

from durable import owners
from workflows.models import WorkflowInvocation


@shared_task(name="workflows.reconcile", ignore_result=True)
def reconcile() -> int:
    """No longer on the beat (durable.reconcile covers every owner): kept so a message the beat sent
    before it changed still runs, the invocations' part of the reconcile. Safe to race."""
    return owners.reconcile(of=[WorkflowInvocation])[WorkflowInvocation._meta.label]

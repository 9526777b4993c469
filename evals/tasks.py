"""Celery entry points of the evals app."""

from celery import shared_task

from evals.execution import eval_runs_reconcile


@shared_task(name="evals.reconcile", ignore_result=True)
def reconcile() -> int:
    """Beat, every 30 s: eval runs whose durable run ended elsewhere take its end. Safe to race."""
    return eval_runs_reconcile()

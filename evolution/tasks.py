"""Celery entry points of the evolution app."""

from celery import shared_task

from evolution.execution import evolution_runs_reconcile


@shared_task(name="evolution.reconcile", ignore_result=True)
def reconcile() -> int:
    """Beat, every 30 s: evolution runs whose durable run ended elsewhere take its end. Safe to race."""
    return evolution_runs_reconcile()

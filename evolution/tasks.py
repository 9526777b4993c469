"""Celery entry points of the evolution app."""

from celery import shared_task

from durable import owners
from evolution.models import EvolutionRun


@shared_task(name="evolution.reconcile", ignore_result=True)
def reconcile() -> int:
    """Beat, every 30 s: evolution runs whose durable run ended without them take its end
    (durable.owners.reconcile). Safe to race (each end is conditional)."""
    return owners.reconcile(of=[EvolutionRun])[EvolutionRun._meta.label]

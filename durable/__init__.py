"""Lineage's durable execution engine: registered workflows replayed turn by turn from
step checkpoints in Postgres, executed by Celery workers. Knows nothing about agents."""

from durable.engine import Child, ChildFailed, FanFailed, Step, StepFailed, heartbeat
from durable.registry import workflow

__all__ = ["Child", "ChildFailed", "FanFailed", "Step", "StepFailed", "heartbeat", "workflow"]

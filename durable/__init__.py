"""Lineage's durable execution engine: registered workflows replayed turn by turn from
step checkpoints in Postgres, executed by Celery workers. Knows nothing about agents."""

from durable.context import Child, Step
from durable.errors import ChildFailed, FanFailed, StepFailed
from durable.registry import workflow
from durable.steps import heartbeat

__all__ = ["Child", "ChildFailed", "FanFailed", "Step", "StepFailed", "heartbeat", "workflow"]

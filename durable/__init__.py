"""Lineage's durable execution engine: registered workflows replayed turn by turn from
step checkpoints in Postgres, executed by Celery workers. Knows nothing about agents."""

from durable.context import Child, Context, Step
from durable.errors import ChildFailed, FanFailed, StepFailed, TryLater
from durable.registry import workflow
from durable.steps import deferrals, heartbeat, release_connection, wait_alive

__all__ = ["Child", "ChildFailed", "Context", "FanFailed", "Step", "StepFailed", "TryLater", "deferrals", "heartbeat",
           "release_connection", "wait_alive", "workflow"]

"""Lineage settings: the Django core in ``base``, each integration in its own module."""

from .agents import *  # noqa: F403
from .base import *  # noqa: F403
from .celery import *  # noqa: F403
from .durable import *  # noqa: F403
from .llm import *  # noqa: F403

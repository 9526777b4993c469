"""The workflow runner's tunables, read from Django settings (their defaults: config/settings/agents.py, llm.py
and durable.py)."""

from dataclasses import dataclass
from decimal import Decimal

from django.conf import settings


@dataclass(frozen=True)
class WorkflowSettings:
    node_budget: int  # node invocations one workflow invocation may run (docs/limits.md); bounds cycles
    usd_budget: Decimal  # USD one invocation may spend on model calls before it fails
    context_inline_chars: int  # a tool output longer than this goes to the context store; the node sees a summary
    summary_chars: int  # characters of a stored output the node (and a node invocation's summary) shows
    llm_cache_enabled: bool  # the Postgres cache of identical temperature-0 calls (LlmCall)
    max_tool_calls: int  # tool calls one model answer may ask for (more fails the node before any runs)
    llm_queue: str  # the Celery queue of model calls and MCP tool calls (LLM_QUEUE)
    call_timeout: float  # the longest silence of one such call's step before the tick hands it to another worker


def workflow_settings() -> WorkflowSettings:
    return WorkflowSettings(
        node_budget=int(settings.WORKFLOW_NODE_BUDGET),
        usd_budget=Decimal(str(settings.WORKFLOW_USD_BUDGET)),
        context_inline_chars=int(settings.WORKFLOW_CONTEXT_INLINE_CHARS),
        summary_chars=int(settings.WORKFLOW_SUMMARY_CHARS),
        llm_cache_enabled=bool(settings.LLM_CACHE_ENABLED),
        max_tool_calls=int(settings.WORKFLOW_MAX_TOOL_CALLS),
        llm_queue=settings.LLM_QUEUE,
        # one try is one HTTP call (a retry is a new try): a killed worker's call is asked again this soon
        call_timeout=min(float(settings.DURABLE_STEP_DEFAULT_TIMEOUT),
                         float(settings.LLM_TIMEOUT_SECONDS) + 30.0),
    )

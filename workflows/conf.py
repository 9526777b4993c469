"""The workflow runner's tunables (Django settings, with these defaults)."""

from dataclasses import dataclass
from decimal import Decimal

from django.conf import settings


@dataclass(frozen=True)
class WorkflowSettings:
    node_budget: int  # node invocations one workflow invocation may run (REFERENCE.md: 14); bounds cycles
    usd_budget: Decimal  # USD one invocation may spend on model calls before it fails
    context_inline_chars: int  # a tool output longer than this goes to the context store; the node sees a summary
    summary_chars: int  # characters of a stored output the node (and a node invocation's summary) shows
    llm_cache_enabled: bool  # the Postgres cache of identical temperature-0 calls (LlmCall)
    max_tool_calls: int  # tool calls one model answer may ask for (more fails the node before any runs)
    llm_queue: str  # the Celery queue of model calls and MCP tool calls (LLM_QUEUE)
    call_timeout: float  # the longest silence of one such call's step before the tick hands it to another worker


def workflow_settings() -> WorkflowSettings:
    return WorkflowSettings(
        node_budget=int(getattr(settings, "WORKFLOW_NODE_BUDGET", 14)),
        usd_budget=Decimal(str(getattr(settings, "WORKFLOW_USD_BUDGET", "1.00"))),
        context_inline_chars=int(getattr(settings, "WORKFLOW_CONTEXT_INLINE_CHARS", 4000)),
        summary_chars=int(getattr(settings, "WORKFLOW_SUMMARY_CHARS", 600)),
        llm_cache_enabled=bool(getattr(settings, "LLM_CACHE_ENABLED", True)),
        max_tool_calls=int(getattr(settings, "WORKFLOW_MAX_TOOL_CALLS", 16)),
        llm_queue=getattr(settings, "LLM_QUEUE", "llm"),
        # one try is one HTTP call (a retry is a new try): a killed worker's call is asked again this soon
        call_timeout=min(float(getattr(settings, "DURABLE_STEP_DEFAULT_TIMEOUT", 300.0)),
                         float(getattr(settings, "LLM_TIMEOUT_SECONDS", 60)) + 30.0),
    )

"""Workflows, MCP, evaluations: the runner's limits and the evals' statistics (workflows/conf.py,
evals/conf.py and workflows/mcp.py document each)."""

from config.env import env_float, env_int, env_list, env_str
from config.settings.llm import LLM_DEFAULT_MODEL

WORKFLOW_NODE_BUDGET = env_int("WORKFLOW_NODE_BUDGET", 14, minimum=1, maximum=1000)
WORKFLOW_USD_BUDGET = env_float("WORKFLOW_USD_BUDGET", 1.0, minimum=0.000001)
WORKFLOW_CONTEXT_INLINE_CHARS = env_int("WORKFLOW_CONTEXT_INLINE_CHARS", 4000, minimum=100)
WORKFLOW_SUMMARY_CHARS = env_int("WORKFLOW_SUMMARY_CHARS", 600, minimum=50)
WORKFLOW_MAX_TOOL_CALLS = env_int("WORKFLOW_MAX_TOOL_CALLS", 16, minimum=1, maximum=1000)
# private networks a registered MCP server may be reached on, e.g. "10.20.0.0/16"; empty: public addresses only
MCP_ALLOWED_NETWORKS = env_list("MCP_ALLOWED_NETWORKS", [])

EVAL_CONCURRENCY = env_int("EVAL_CONCURRENCY", 64, minimum=1, maximum=64)
# the LLM judge's model, and the model the evals' rewriter asks for a better prompt ("": the node's own model)
EVAL_JUDGE_MODEL = env_str("EVAL_JUDGE_MODEL", LLM_DEFAULT_MODEL)
EVAL_REWRITER_MODEL = env_str("EVAL_REWRITER_MODEL", "")
EVAL_ALPHA = env_float("EVAL_ALPHA", 0.05, minimum=0.0001)
EVAL_CRITICAL_TOLERANCE = env_float("EVAL_CRITICAL_TOLERANCE", 0.1, minimum=0.0)
EVAL_BOOTSTRAP_RESAMPLES = env_int("EVAL_BOOTSTRAP_RESAMPLES", 10_000, minimum=100, maximum=1_000_000)
EVAL_MAX_ITEMS_PER_SET = env_int("EVAL_MAX_ITEMS_PER_SET", 5000, minimum=1, maximum=100_000)
EVAL_REGEX_TIMEOUT_SECONDS = env_float("EVAL_REGEX_TIMEOUT_SECONDS", 2.0, minimum=0.01)

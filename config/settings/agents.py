"""Workflows, MCP, evaluations: the runner's limits and the evals' statistics (workflows/conf.py,
evals/conf.py and workflows/mcp.py document each)."""

from django.core.exceptions import ImproperlyConfigured

from config.env import env_float, env_int, env_list, env_str
from config.settings.llm import LLM_DEFAULT_MODEL

WORKFLOW_NODE_BUDGET = env_int("WORKFLOW_NODE_BUDGET", 14, minimum=1, maximum=1000)
WORKFLOW_USD_BUDGET = env_float("WORKFLOW_USD_BUDGET", 1.0, minimum=0.000001)
WORKFLOW_CONTEXT_INLINE_CHARS = env_int("WORKFLOW_CONTEXT_INLINE_CHARS", 4000, minimum=100)
WORKFLOW_SUMMARY_CHARS = env_int("WORKFLOW_SUMMARY_CHARS", 600, minimum=50)
WORKFLOW_MAX_TOOL_CALLS = env_int("WORKFLOW_MAX_TOOL_CALLS", 16, minimum=1, maximum=1000)
# private networks a registered MCP server may be reached on, e.g. "10.20.0.0/16"; empty: public addresses only
MCP_ALLOWED_NETWORKS = env_list("MCP_ALLOWED_NETWORKS", [])

# items of one eval run in flight (its lanes): twice LLM_MAX_IN_FLIGHT's default, since an item spends part of its
# life between calls (its turns, its grading), and the calls in flight are bounded by the llm worker and the
# provider's limits, not by the lanes (evals.conf.MAX_CONCURRENCY at most)
EVAL_CONCURRENCY = env_int("EVAL_CONCURRENCY", 128, minimum=1, maximum=1024)
# the LLM judge's model, and the model the evals' rewriter asks for a better prompt ("": the node's own model)
EVAL_JUDGE_MODEL = env_str("EVAL_JUDGE_MODEL", LLM_DEFAULT_MODEL)
EVAL_REWRITER_MODEL = env_str("EVAL_REWRITER_MODEL", "")
EVAL_ALPHA = env_float("EVAL_ALPHA", 0.05, minimum=0.0001)
EVAL_CRITICAL_TOLERANCE = env_float("EVAL_CRITICAL_TOLERANCE", 0.1, minimum=0.0)
EVAL_BOOTSTRAP_RESAMPLES = env_int("EVAL_BOOTSTRAP_RESAMPLES", 10_000, minimum=100, maximum=1_000_000)
EVAL_MAX_ITEMS_PER_SET = env_int("EVAL_MAX_ITEMS_PER_SET", 5000, minimum=1, maximum=100_000)
EVAL_REGEX_TIMEOUT_SECONDS = env_float("EVAL_REGEX_TIMEOUT_SECONDS", 2.0, minimum=0.01)


def _split_shares(raw: list[str]) -> tuple[float, float, float]:
    """Three positive numbers (train, validation, test) as shares summing to 1."""
    try:
        shares = [float(value) for value in raw]
    except ValueError:
        shares = []
    if len(shares) != 3 or not all(0 < share < float("inf") for share in shares):
        raise ImproperlyConfigured(f"EVAL_SPLIT_PROPORTIONS={','.join(raw)!r} is not valid: expected three positive "
                                   "numbers, train,validation,test (for example 50,25,25).")
    return tuple(share / sum(shares) for share in shares)


# a golden set's items per split (evals/splits.py): train, validation, test
EVAL_SPLIT_PROPORTIONS = _split_shares(env_list("EVAL_SPLIT_PROPORTIONS", ["50", "25", "25"]))
# a set of fewer items cannot carry a held-out claim (each split needs at least 3 items, so at least 9)
EVAL_MIN_SPLIT_ITEMS = env_int("EVAL_MIN_SPLIT_ITEMS", 12, minimum=9, maximum=100_000)

"""The evals app's tunables, read from Django settings (their defaults: config/settings/agents.py)."""

from dataclasses import dataclass

from django.conf import settings

# the most items one eval run may keep in flight (EVAL_CONCURRENCY, a run's `concurrency`, an evolution's)
MAX_CONCURRENCY = 1024


@dataclass(frozen=True)
class EvalSettings:
    concurrency: int  # items of one eval run in flight at once (its lanes: child runs taking their items in turn)
    judge_model: str  # the LLM judge's model (answered offline without a key: the judge then falls back)
    alpha: float  # the significance level a promotion needs (paired Wilcoxon signed-rank test)
    critical_tolerance: float  # a critical item may lose at most this much score in a promotion
    bootstrap_resamples: int  # resamples of the paired bootstrap giving the mean difference's 95% interval
    max_items_per_set: int  # items a golden set may hold (item create and import refuse more)
    regex_timeout: float  # seconds one grader may spend matching user patterns on one answer (then a grading error)
    rewriter_model: str  # the model that rewrites prompts; "" is the rewritten node's own model
    split_proportions: tuple[float, float, float]  # train, validation, test shares (summing to 1: settings)
    min_split_items: int  # a set of fewer items cannot carry a held-out claim (selectors.split_plan)


def eval_settings() -> EvalSettings:
    return EvalSettings(
        concurrency=int(settings.EVAL_CONCURRENCY),
        judge_model=settings.EVAL_JUDGE_MODEL,
        alpha=float(settings.EVAL_ALPHA),
        critical_tolerance=float(settings.EVAL_CRITICAL_TOLERANCE),
        bootstrap_resamples=int(settings.EVAL_BOOTSTRAP_RESAMPLES),
        max_items_per_set=int(settings.EVAL_MAX_ITEMS_PER_SET),
        regex_timeout=float(settings.EVAL_REGEX_TIMEOUT_SECONDS),
        rewriter_model=settings.EVAL_REWRITER_MODEL,
        split_proportions=tuple(settings.EVAL_SPLIT_PROPORTIONS),
        min_split_items=int(settings.EVAL_MIN_SPLIT_ITEMS),
    )

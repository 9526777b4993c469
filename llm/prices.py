"""USD prices per million tokens, by model.

The table covers the models the project names by default; an operator adds or overrides
entries with the ``LLM_PRICES`` setting (``{"model": {"input": 0.02, "output": 0}}``). A model
missing from both costs 0 and is logged once, so an unknown local model never breaks a run.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from decimal import Decimal

from django.conf import settings

logger = logging.getLogger("llm.prices")


@dataclass(frozen=True)
class Price:
    input: Decimal  # USD per 1M input (prompt) tokens
    output: Decimal = Decimal(0)  # USD per 1M output (completion) tokens


def _p(inp: str, out: str = "0") -> Price:
    return Price(Decimal(inp), Decimal(out))


PRICES: dict[str, Price] = {
    # embeddings
    "text-embedding-3-small": _p("0.02"),
    "text-embedding-3-large": _p("0.13"),
    "text-embedding-ada-002": _p("0.10"),
    "offline-hash-v1": _p("0"),
    "offline-hash-v2": _p("0"),
    # chat
    "gpt-4.1": _p("2.00", "8.00"),
    "gpt-4.1-mini": _p("0.40", "1.60"),
    "gpt-4.1-nano": _p("0.10", "0.40"),
    "gpt-4o": _p("2.50", "10.00"),
    "gpt-4o-mini": _p("0.15", "0.60"),
    "o4-mini": _p("1.10", "4.40"),
    "offline": _p("0"),
    "offline-directive-v1": _p("0"),  # the deterministic offline chat model (llm/offline_chat.py)
}

_MILLION = Decimal(1_000_000)
_warned: set[str] = set()


def price_for(model: str) -> Price | None:
    overrides = getattr(settings, "LLM_PRICES", {}) or {}
    if model in overrides:
        entry = overrides[model]
        return Price(Decimal(str(entry.get("input", 0))), Decimal(str(entry.get("output", 0))))
    if model in PRICES:
        return PRICES[model]
    if "/" in model:  # a router's vendor-qualified name ("openai/gpt-4.1-mini") costs what the model costs
        return price_for(model.rsplit("/", 1)[1])
    # dated snapshots ("gpt-4.1-mini-2025-04-14") cost what their family costs
    family = max((name for name in PRICES if model.startswith(name + "-")), key=len, default=None)
    return PRICES[family] if family else None


def cost_usd(model: str, *, input_tokens: int = 0, output_tokens: int = 0) -> Decimal:
    """The USD cost of one call, rounded to 1e-8; 0 for a model with no known price."""
    price = price_for(model)
    if price is None:
        if model not in _warned:
            _warned.add(model)
            logger.warning("No price known for model %r: its usage is recorded at 0 USD (set LLM_PRICES).", model)
        return Decimal(0)
    cost = (price.input * input_tokens + price.output * output_tokens) / _MILLION
    return cost.quantize(Decimal("0.00000001"))

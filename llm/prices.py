"""USD prices of model calls: ``LLM_PRICES`` first, then the maintained price database ``genai-prices``
(many providers, dated snapshots, tiered and cached-input prices; its data ships in the package and is
never fetched at run time).

``LLM_PRICES`` keys, most specific first: ``"<provider>#<model>"``, ``"<provider>#*"`` (every model of
a provider, e.g. a free local server), then ``"<model>"``; values are USD per million tokens,
``{"input": 0.4, "output": 1.6}``. In the database a provider is found by its name when the database
knows it (``openai``, ``openrouter``, ``groq``...), else by its base URL. The offline models cost 0
unless ``LLM_PRICES`` prices them (tests of budgets do).

A model priced by neither costs 0 and is logged once; ``price_problem`` says so before a run under a
USD budget starts (a budget such a model's calls never count against would never bind).
"""

from __future__ import annotations

import logging
from decimal import Decimal
from functools import partial

from django.conf import settings

logger = logging.getLogger("llm.prices")

# the models of this machine (llm/offline_chat.py, llm/embeddings.py): free
FREE_MODELS = frozenset({"offline", "offline-directive-v1", "offline-hash-v1", "offline-hash-v2",
                         "wordllama-l2-supercat"})
_MILLION = Decimal(1_000_000)
_warned: set[str] = set()


def _override(provider: str, model: str) -> dict | None:
    overrides = getattr(settings, "LLM_PRICES", None) or {}
    for key in (f"{provider}#{model}" if provider else None, f"{provider}#*" if provider else None, model):
        if key is not None and key in overrides:
            return overrides[key]
    return None


def _database_cost(provider: str, model: str, input_tokens: int, output_tokens: int,
                   cached_input_tokens: int) -> Decimal | None:
    """The database's price of this call, or None when it knows no price for the model there."""
    from genai_prices import Usage, calc_price

    from llm.providers import provider_config

    usage = Usage(input_tokens=input_tokens, output_tokens=output_tokens,
                  cache_read_tokens=cached_input_tokens or None)
    config = provider_config(provider) if provider else None
    url = config.url() if config is not None else None
    attempts = [partial(calc_price, usage, model, provider_id=provider or None)]
    if url:
        attempts.append(partial(calc_price, usage, model, provider_api_url=url))
    for price in attempts:
        try:
            return Decimal(price().total_price)
        except LookupError:
            continue
    return None


def _cost(provider: str, model: str, input_tokens: int, output_tokens: int, cached_input_tokens: int
          ) -> Decimal | None:
    entry = _override(provider, model)
    if entry is not None:
        return (Decimal(str(entry.get("input", 0))) * input_tokens
                + Decimal(str(entry.get("output", 0))) * output_tokens) / _MILLION
    if model in FREE_MODELS:
        return Decimal(0)
    return _database_cost(provider, model, input_tokens, output_tokens, cached_input_tokens)


def price_known(model: str, *, provider: str = "") -> bool:
    """Whether calls to `model` on `provider` have a price (LLM_PRICES, the database, or free)."""
    return _cost(provider, model, 1000, 1000, 0) is not None


def cost_usd(model: str, *, provider: str = "", input_tokens: int = 0, output_tokens: int = 0,
             cached_input_tokens: int = 0, requested: str | None = None) -> Decimal:
    """The USD cost of one call, rounded to 1e-8. `model` is the model that answered; `requested`, the
    name it was asked for, prices the call when the answering name is unknown (a local server's
    "llama3.2:latest" for "llama3.2"). 0, logged once, for a model with no known price."""
    cost = _cost(provider, model, input_tokens, output_tokens, cached_input_tokens)
    if cost is None and requested and requested != model:
        cost = _cost(provider, requested, input_tokens, output_tokens, cached_input_tokens)
    if cost is None:
        label = f"{provider}#{model}" if provider else model
        if label not in _warned:
            _warned.add(label)
            logger.warning("No price known for %r: its usage is recorded at 0 USD (set LLM_PRICES).", label)
        return Decimal(0)
    return cost.quantize(Decimal("0.00000001"))


def price_problem(model_name: str) -> str | None:
    """Why calls to `model_name` (as written in a workflow) cannot run under a USD budget on this
    installation: no price is known for the model it resolves to. None when it is priced (or unknown
    altogether: that is the model resolution's error to report)."""
    from llm.errors import UnknownModel
    from llm.names import resolve_model

    try:
        resolved = resolve_model(model_name)
    except UnknownModel:
        return None
    if price_known(resolved.model, provider=resolved.provider):
        return None
    return (f"no price is known for {resolved.provider} model {resolved.model!r}, so a USD budget cannot bind: "
            f'set LLM_PRICES, e.g. LLM_PRICES=\'{{"{resolved.provider}#{resolved.model}": '
            f'{{"input": 0, "output": 0}}}}\' for a free local model')

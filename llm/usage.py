"""Token and cost accounting for provider calls.

Every provider call returns a ``Usage``; callers add them up (``Usage.__add__``) and store the
totals on their own rows (a knowledge source keeps its embedding tokens and cost, a node
invocation its chat tokens and cost). ``usage_meter()`` collects every call made inside a block,
whatever code made it, for callers that do not see the individual calls.
"""

from __future__ import annotations

import contextvars
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from decimal import Decimal

from llm.prices import cost_usd


@dataclass(frozen=True)
class Usage:
    provider: str = ""
    model: str = ""
    input_tokens: int = 0
    output_tokens: int = 0
    usd_cost: Decimal = Decimal(0)
    calls: int = 0

    @classmethod
    def priced(cls, *, provider: str, model: str, input_tokens: int = 0, output_tokens: int = 0,
               calls: int = 1, cached_input_tokens: int = 0, requested: str | None = None) -> Usage:
        """A call's usage priced by llm/prices.py (`cached_input_tokens` of the input read from the
        provider's prompt cache; `requested`, the model name asked for, when another answered)."""
        cost = cost_usd(model, provider=provider, input_tokens=input_tokens, output_tokens=output_tokens,
                        cached_input_tokens=cached_input_tokens, requested=requested)
        return cls(provider=provider, model=model, input_tokens=input_tokens, output_tokens=output_tokens,
                   usd_cost=cost, calls=calls)

    def __add__(self, other: Usage) -> Usage:
        if not isinstance(other, Usage):
            return NotImplemented
        return Usage(
            provider=_merge(self.provider, other.provider),
            model=_merge(self.model, other.model),
            input_tokens=self.input_tokens + other.input_tokens,
            output_tokens=self.output_tokens + other.output_tokens,
            usd_cost=self.usd_cost + other.usd_cost,
            calls=self.calls + other.calls,
        )

    @property
    def total_tokens(self) -> int:
        return self.input_tokens + self.output_tokens

    def as_dict(self) -> dict:
        """A JSON-serialisable form (durable step results, API payloads)."""
        return {"provider": self.provider, "model": self.model, "input_tokens": self.input_tokens,
                "output_tokens": self.output_tokens, "usd_cost": f"{self.usd_cost:f}", "calls": self.calls}

    @classmethod
    def from_dict(cls, data: dict) -> Usage:
        return cls(provider=data.get("provider", ""), model=data.get("model", ""),
                   input_tokens=int(data.get("input_tokens", 0)), output_tokens=int(data.get("output_tokens", 0)),
                   usd_cost=Decimal(str(data.get("usd_cost", "0"))), calls=int(data.get("calls", 0)))


def _merge(a: str, b: str) -> str:
    return a or b if (not a or not b or a == b) else "mixed"


@dataclass
class UsageMeter:
    records: list[Usage] = field(default_factory=list)

    @property
    def total(self) -> Usage:
        total = Usage()
        for record in self.records:
            total = total + record
        return total


_meters: contextvars.ContextVar[tuple[UsageMeter, ...]] = contextvars.ContextVar("llm_usage_meters", default=())


@contextmanager
def usage_meter() -> Iterator[UsageMeter]:
    """Collect the usage of every provider call made inside the block (nested meters all see it)."""
    meter = UsageMeter()
    token = _meters.set((*_meters.get(), meter))
    try:
        yield meter
    finally:
        _meters.reset(token)


def record_usage(usage: Usage) -> Usage:
    """Called by providers after each call."""
    for meter in _meters.get():
        meter.records.append(usage)
    return usage


def estimate_tokens(text: str) -> int:
    """A provider-independent token estimate (about four characters a token for English text),
    used where no tokenizer answers: the offline provider and chunk sizes."""
    return (len(text) + 3) // 4 if text else 0

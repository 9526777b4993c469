from decimal import Decimal

from llm.prices import cost_usd
from llm.usage import Usage, estimate_tokens


def test_cost_from_the_price_table():
    assert cost_usd("text-embedding-3-small", input_tokens=1_000_000) == Decimal("0.02")
    assert cost_usd("gpt-4.1-mini", input_tokens=1000, output_tokens=500) == Decimal("0.00120000")


def test_dated_snapshot_costs_what_its_family_costs():
    assert cost_usd("gpt-4.1-mini-2025-04-14", input_tokens=1_000_000) == Decimal("0.40")


def test_unknown_model_costs_zero_and_override_applies(settings):
    assert cost_usd("my-local-model", input_tokens=10_000) == Decimal(0)
    settings.LLM_PRICES = {"my-local-model": {"input": 1.5, "output": 3}}
    assert cost_usd("my-local-model", input_tokens=1_000_000, output_tokens=1_000_000) == Decimal("4.5")


def test_usage_adds_up_and_round_trips_through_json():
    total = Usage.priced(provider="openai", model="text-embedding-3-small", input_tokens=500_000) + \
        Usage.priced(provider="openai", model="text-embedding-3-small", input_tokens=500_000)
    assert total.input_tokens == 1_000_000 and total.usd_cost == Decimal("0.02") and total.calls == 2
    assert Usage.from_dict(total.as_dict()) == total
    mixed = total + Usage.priced(provider="offline", model="offline-hash-v1", input_tokens=1)
    assert mixed.provider == "mixed"


def test_token_estimate():
    assert estimate_tokens("") == 0
    assert estimate_tokens("abcd" * 10) == 10


def test_a_vendor_qualified_name_costs_what_the_model_costs():
    from llm.prices import cost_usd

    assert cost_usd("openai/gpt-4.1-mini", input_tokens=1000) == cost_usd("gpt-4.1-mini", input_tokens=1000) > 0

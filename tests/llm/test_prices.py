import os
import subprocess
import sys
from decimal import Decimal
from pathlib import Path

from llm.prices import cost_usd, price_known
from llm.usage import Usage, estimate_tokens


def test_cost_from_the_price_database():
    assert cost_usd("text-embedding-3-small", provider="openai", input_tokens=1_000_000) == Decimal("0.02")
    assert cost_usd("gpt-4.1-mini", provider="openai", input_tokens=1000, output_tokens=500) == Decimal("0.00120000")
    # models the old hand-kept table never had
    assert cost_usd("gpt-5", provider="openai", input_tokens=1_000_000) == Decimal("1.25")


def test_dated_snapshot_costs_what_its_family_costs():
    assert cost_usd("gpt-4.1-mini-2025-04-14", provider="openai", input_tokens=1_000_000) == Decimal("0.40")


def test_cached_and_tiered_prices():
    # half the input read from the prompt cache: 0.5M x 0.40 + 0.5M x 0.10
    assert cost_usd("gpt-4.1-mini", provider="openai", input_tokens=1_000_000,
                    cached_input_tokens=500_000) == Decimal("0.25")
    # a long prompt costs more per token past the tier's threshold
    short = cost_usd("gemini-2.5-pro", provider="google", input_tokens=100_000) / 100_000
    long = cost_usd("gemini-2.5-pro", provider="google", input_tokens=300_000) / 300_000
    assert long > short


def test_unknown_model_costs_zero_and_overrides_apply(settings):
    assert cost_usd("my-local-model", provider="ollama", input_tokens=10_000) == Decimal(0)
    assert not price_known("my-local-model", provider="ollama")
    settings.LLM_PRICES = {"my-local-model": {"input": 1.5, "output": 3}}
    assert cost_usd("my-local-model", input_tokens=1_000_000, output_tokens=1_000_000) == Decimal("4.5")
    # a provider's model, then every model of a provider, before the bare name
    settings.LLM_PRICES = {"ollama#*": {"input": 0, "output": 0}, "ollama#big": {"input": 2},
                           "gpt-4.1-mini": {"input": 9}}
    assert price_known("anything", provider="ollama") and cost_usd("x", provider="ollama", input_tokens=10**6) == 0
    assert cost_usd("big", provider="ollama", input_tokens=10**6) == Decimal(2)
    assert cost_usd("gpt-4.1-mini", provider="openai", input_tokens=10**6) == Decimal(9)
    # a local server answering under another name than the one asked for is priced as asked
    settings.LLM_PRICES = {"vllm#big": {"input": 2}}
    assert cost_usd("big:latest", provider="vllm", input_tokens=10**6, requested="big") == Decimal(2)


def test_the_offline_models_are_free():
    for model in ("offline-directive-v1", "wordllama-l2-supercat", "offline-hash-v2"):
        assert price_known(model, provider="offline") and cost_usd(model, input_tokens=10**6) == 0


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

    assert cost_usd("openai/gpt-4.1-mini", provider="openrouter", input_tokens=1000) == \
        cost_usd("gpt-4.1-mini", provider="openai", input_tokens=1000) > 0


def test_a_web_process_loads_the_price_database_and_the_provider_client_as_it_boots():
    # gunicorn's workers import config.wsgi as they boot: the first request that starts a run (its USD budget
    # checks the model's price) must not pay for loading them
    code = ("import sys, config.wsgi; "
            "print('genai_prices.data_snapshot' in sys.modules, 'openai' in sys.modules)")
    environment = {**os.environ, "LLM_PROVIDER": "openai", "OPENAI_API_KEY": "sk-test"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=environment, check=True,
                         cwd=Path(__file__).parents[2], timeout=120)
    assert out.stdout.split() == ["True", "True"]

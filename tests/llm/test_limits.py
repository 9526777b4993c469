"""Provider limits across processes (llm/limits.py), counted in the suite's real Redis."""

import threading
import uuid

import pytest

from llm import limits
from llm.chat import PutOff, chat
from llm.errors import CallPutOff
from llm.types import ChatRequest


@pytest.fixture
def provider(settings):
    """A provider of its own for each test (its counters start empty), with the limits a test sets."""
    name = f"p{uuid.uuid4().hex[:10]}"

    def configure(**entry):
        settings.LLM_PROVIDERS = {name: {"base_url": "http://127.0.0.1:9/v1", **entry}}
        return name

    return configure


def test_the_concurrency_cap_holds_across_callers_and_a_release_frees_a_slot(provider):
    name = provider(max_concurrency=3)
    results = []
    barrier = threading.Barrier(8)

    def take():
        barrier.wait()
        results.append(limits.admit(name, "m"))

    threads = [threading.Thread(target=take) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    admitted = [result for result in results if result.admitted]
    assert len(admitted) == 3
    refused = next(result for result in results if not result.admitted)
    assert refused.reason == f"{name} has 3 calls in flight (its max_concurrency)" and refused.wait > 0
    limits.release(admitted[0])
    assert limits.admit(name, "m").admitted


def test_a_full_window_gives_each_waiting_call_its_own_start_in_order(provider):
    name = provider(requests_per_minute=2)
    assert limits.admit(name, "m", caller="a").admitted
    assert limits.admit(name, "m", caller="b").admitted
    third = limits.admit(name, "m", caller="c")
    fourth = limits.admit(name, "m", caller="d")
    assert not third.admitted and not fourth.admitted
    assert third.reason == f"rate limited by {name} (2 requests a minute)"
    assert 55 < third.wait <= 61 and 55 < fourth.wait <= 61
    # asking again keeps its reserved start instead of taking a later one
    again = limits.admit(name, "m", caller="c")
    assert not again.admitted and abs(again.wait - third.wait) < 1


def test_a_model_with_limits_of_its_own_has_its_own_counters(provider):
    name = provider(max_concurrency=1, models={"big": {"max_concurrency": 2}})
    assert limits.admit(name, "small").admitted
    assert not limits.admit(name, "other").admitted  # the provider's one slot is taken
    assert limits.admit(name, "big").admitted and limits.admit(name, "big").admitted
    assert not limits.admit(name, "big").admitted


def test_a_call_in_a_durable_step_is_put_off_by_a_limit_without_reaching_the_provider(provider, settings):
    settings.LLM_PROVIDER = "openai"
    name = provider(requests_per_minute=1)
    assert limits.admit(name, "m").admitted  # the minute's one start is taken
    with pytest.raises(CallPutOff) as caught:  # the provider's address answers nothing: never reached
        chat(ChatRequest(model=f"{name}#m", messages=[{"role": "user", "content": "hi"}]), put_off=PutOff("x"))
    assert caught.value.kind == "limit"
    assert caught.value.reason.startswith(f"rate limited by {name} (1 requests a minute): retry in ")


def test_a_call_the_provider_refused_is_not_counted_as_a_start_and_keeps_the_window(provider, settings,
                                                                                      openai_server):
    # the provider counts its minute from when requests reach it, a little later than this side admitted
    # them: it may refuse a call the window let through. That call did not start; asked again once the
    # provider's Retry-After has passed, it goes, instead of waiting a whole window behind its own lost start
    settings.LLM_PROVIDER = "openai"
    name = provider(requests_per_minute=2, base_url=openai_server.url("/v1"))
    openai_server.chat_replies = [(429, {"Content-Type": "application/json", "Retry-After": "0"},
                                   '{"error": {"message": "Rate limit reached for requests"}}')]
    assert limits.admit(name, "m", caller="other").admitted  # one of the minute's two starts
    request = ChatRequest(model=f"{name}#m", messages=[{"role": "user", "content": "hi"}])
    with pytest.raises(CallPutOff) as caught:
        chat(request, put_off=PutOff("call"))
    assert caught.value.kind == "provider"  # the 429, retried after the provider's Retry-After (0 s)
    answer, _ = chat(request, put_off=PutOff("call", retries_done=1))
    assert answer.content == "ok" and len(openai_server.chat_payloads) == 2
    # the window holds the two starts that happened: nothing more goes this minute
    assert not limits.admit(name, "m", caller="third").admitted

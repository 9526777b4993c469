"""The one retry policy of chat and embedding calls (llm/retry.py)."""

from datetime import UTC, datetime

from llm.retry import RetryPolicy, retry_after_seconds

POLICY = RetryPolicy(max_retries=3, backoff_seconds=1.0, cap_seconds=5.0)


def test_backoff_doubles_with_jitter_and_is_capped():
    assert [POLICY.delay(n, jitter=lambda: 1.0) for n in (1, 2, 3)] == [1.0, 2.0, 4.0]
    assert POLICY.delay(1, jitter=lambda: 0.0) == 0.5  # jitter goes down to half
    assert RetryPolicy(max_retries=9, backoff_seconds=1.0, cap_seconds=5.0).delay(6, jitter=lambda: 1.0) == 5.0


def test_the_servers_wait_wins_up_to_the_cap_and_retries_run_out():
    assert POLICY.delay(1, retry_after=2.5) == 2.5
    assert POLICY.delay(1, retry_after=60) == 5.0
    assert POLICY.delay(4, retry_after=1) is None  # three retries, then give up
    assert RetryPolicy(max_retries=0, backoff_seconds=1, cap_seconds=1).delay(1) is None


def test_retry_after_headers():
    assert retry_after_seconds({"retry-after-ms": "1500", "retry-after": "9"}) == 1.5
    assert retry_after_seconds({"retry-after": "3"}) == 3.0
    now = datetime(2025, 1, 1, 12, 0, 0, tzinfo=UTC)
    assert retry_after_seconds({"retry-after": "Wed, 01 Jan 2025 12:00:07 GMT"}, now=now) == 7.0
    assert retry_after_seconds({"retry-after": "soon"}) is None
    assert retry_after_seconds({}) is None and retry_after_seconds(None) is None

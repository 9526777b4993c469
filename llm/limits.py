"""Provider limits (``max_concurrency``, ``requests_per_minute`` of llm/providers.py), enforced across
every process that calls the provider: the counters live in Redis (``REDIS_URL``, the broker's), and
each admission is one Lua script, so two workers can never both take the last slot.

- Concurrency: a set of holders, each with an expiry (``LLM_TIMEOUT_SECONDS`` and a margin), so a
  holder whose process was killed mid-call frees its slot by itself. A call released in time frees
  it at once.
- Requests per minute: a sliding window of start times. A call that finds the window full is given
  the first start time the window allows and that time is reserved for it (a reservation named by
  the caller's key), so calls waiting for the window are served in order, each at its own time,
  instead of all waking at once to race for the next free start. A start the provider refused (a 429:
it counts its minute from when requests reach it, a little later than they were admitted here) is taken
out of the window again (``give_back_start``), so the call's retry is not put a whole window behind it.

The scope of the counters is the provider, or the provider's model when ``LLM_PROVIDERS`` gives that
model limits of its own. ``admit`` never waits: it answers "go" or "not before `wait` seconds, because
`reason`"; the caller decides how to wait (a durable timer, or a sleep outside durable runs).
"""

from __future__ import annotations

import os
import uuid
from dataclasses import dataclass
from functools import lru_cache

from django.conf import settings

from llm.providers import ProviderLimits, provider_config

WINDOW_SECONDS = 60.0
CONCURRENCY_RETRY_SECONDS = 1.0
# a reserved start is this much past the window's edge: the provider saw the start it is spaced from a
# little later than it was admitted here, and counting from there it would still refuse the call
MARGIN_SECONDS = 0.5

_ADMIT = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local max_concurrency, per_minute = tonumber(ARGV[1]), tonumber(ARGV[2])
local holder, hold_for, window = ARGV[3], tonumber(ARGV[4]), tonumber(ARGV[5])
if max_concurrency > 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
  if redis.call('ZCARD', KEYS[1]) >= max_concurrency then
    return {0, tostring(ARGV[6]), 'concurrency'}
  end
end
local start = holder
if per_minute > 0 then
  local reserved = redis.call('GET', KEYS[3])
  if reserved then
    local space = string.find(reserved, ' ')
    local at = tonumber(space and string.sub(reserved, 1, space - 1) or reserved)
    if at > now then
      return {0, tostring(at - now), 'rate'}
    end
    if space then start = string.sub(reserved, space + 1) end
    redis.call('DEL', KEYS[3])
  else
    redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now - window)
    local count = redis.call('ZCARD', KEYS[2])
    local at = now
    if count >= per_minute then
      local nth = redis.call('ZRANGE', KEYS[2], count - per_minute, count - per_minute, 'WITHSCORES')
      at = math.max(now, tonumber(nth[2]) + window + tonumber(ARGV[7]))
    end
    redis.call('ZADD', KEYS[2], at, holder)
    redis.call('EXPIRE', KEYS[2], math.ceil(at - now + 2 * window))
    if at > now then
      redis.call('SET', KEYS[3], tostring(at) .. ' ' .. holder, 'EX', math.ceil(at - now + 5 * window))
      return {0, tostring(at - now), 'rate'}
    end
  end
end
if max_concurrency > 0 then
  redis.call('ZADD', KEYS[1], now + hold_for, holder)
  redis.call('EXPIRE', KEYS[1], math.ceil(hold_for + window))
end
return {1, '0', '', start}
"""


@dataclass(frozen=True)
class Admission:
    admitted: bool
    wait: float = 0.0  # seconds before asking again, when not admitted
    reason: str = ""  # why not, for the operator: "rate limited by openrouter (60 requests a minute)"
    holder: str = ""  # the slot taken, for `release`
    scope: str = ""
    start: str = ""  # the start it counts in the requests-per-minute window, for `give_back_start`


@lru_cache(maxsize=4)
def _client(url: str, pid: int):
    import redis

    return redis.Redis.from_url(url, socket_timeout=5, socket_connect_timeout=5, health_check_interval=30)


def _redis():
    return _client(settings.REDIS_URL, os.getpid())


@lru_cache(maxsize=4)
def _script(url: str, pid: int):
    return _client(url, pid).register_script(_ADMIT)


def scope_of(provider: str, model: str) -> tuple[str, ProviderLimits]:
    """The counters a call to `model` on `provider` uses, and their limits."""
    config = provider_config(provider)
    if config is None:
        return provider, ProviderLimits()
    if model in config.model_limits:
        return f"{provider}/{model}", config.limits_for(model)
    return provider, config.limits


def limited(limits: ProviderLimits) -> bool:
    return bool(limits.max_concurrency or limits.requests_per_minute)


def admit(provider: str, model: str, *, caller: str = "") -> Admission:
    """Take a slot for one call to `model` on `provider` now, or say how long to wait and why.
    `caller` names the call across its tries (its reserved start time is kept under that name); a
    call with no name gets a new one, so its reservation is only good for this try."""
    scope, limits = scope_of(provider, model)
    if not limited(limits):
        return Admission(admitted=True, scope=scope)
    holder = uuid.uuid4().hex
    prefix = f"lineage:llm:{scope}"
    caller = caller or holder
    admitted, wait, kind, *start = _script(settings.REDIS_URL, os.getpid())(
        keys=[f"{prefix}:holders", f"{prefix}:starts", f"{prefix}:reserved:{caller}"],
        args=[limits.max_concurrency or 0, limits.requests_per_minute or 0, holder,
              float(settings.LLM_TIMEOUT_SECONDS) + 10.0, WINDOW_SECONDS, CONCURRENCY_RETRY_SECONDS, MARGIN_SECONDS])
    if int(admitted):
        # a reserved start is counted under the try that reserved it
        start = start[0].decode() if isinstance(start[0], bytes) else start[0]
        return Admission(admitted=True, holder=holder if limits.max_concurrency else "", scope=scope,
                         start=start if limits.requests_per_minute else "")
    kind = kind.decode() if isinstance(kind, bytes) else kind
    if kind == "rate":
        reason = f"rate limited by {scope} ({limits.requests_per_minute} requests a minute)"
    else:
        reason = f"{scope} has {limits.max_concurrency} calls in flight (its max_concurrency)"
    return Admission(admitted=False, wait=float(wait), reason=reason, scope=scope)


def give_back_start(admission: Admission) -> None:
    """The provider refused the admitted call (a 429): it did not start, so its start leaves the window."""
    if admission.start:
        _redis().zrem(f"lineage:llm:{admission.scope}:starts", admission.start)


def release(admission: Admission) -> None:
    """Give back the concurrency slot an admitted call took (its expiry frees it anyway)."""
    if admission.holder:
        _redis().zrem(f"lineage:llm:{admission.scope}:holders", admission.holder)

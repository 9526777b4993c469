"""API rate limits (Django REST framework's throttling, counted in Django's cache on Redis).

Rates are REST_FRAMEWORK["DEFAULT_THROTTLE_RATES"] (API_THROTTLE_LOGIN_RATE, API_THROTTLE_WRITE_RATE),
read when a request is checked, so a scope left out, or set "off", is not limited. A request refused
gets 429 with Retry-After in the API's one error body (workspaces/api/errors.py). A cache that does
not answer lets requests through (logged): the limits protect the service, they are not what serves it.
"""

from __future__ import annotations

import logging

from redis.exceptions import RedisError
from rest_framework.permissions import SAFE_METHODS
from rest_framework.settings import api_settings
from rest_framework.throttling import SimpleRateThrottle

logger = logging.getLogger("workspaces.api")


class _SettingsRateThrottle(SimpleRateThrottle):
    def get_rate(self) -> str | None:
        return api_settings.DEFAULT_THROTTLE_RATES.get(self.scope)

    def allow_request(self, request, view) -> bool:
        try:
            return super().allow_request(request, view)
        except RedisError as exc:
            logger.warning("api: the %s rate limit is not checked: the cache does not answer (%s)", self.scope, exc)
            return True


class LoginRateThrottle(_SettingsRateThrottle):
    """Token requests (POST /api/auth/token/) per client address."""

    scope = "login"

    def get_cache_key(self, request, view) -> str:
        return self.cache_format % {"scope": self.scope, "ident": self.get_ident(request)}


class WriteRateThrottle(_SettingsRateThrottle):
    """Writes (every method but GET, HEAD, OPTIONS) per user, or per client address when anonymous."""

    scope = "write"

    def get_cache_key(self, request, view) -> str | None:
        if request.method in SAFE_METHODS:
            return None
        user = getattr(request, "user", None)
        ident = f"user-{user.pk}" if user is not None and user.is_authenticated else self.get_ident(request)
        return self.cache_format % {"scope": self.scope, "ident": ident}

from datetime import timedelta
from pathlib import Path
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

from config.env import env_bool, env_choice, env_float, env_int, env_list, env_rate, env_str, env_url

BASE_DIR = Path(__file__).resolve().parent.parent.parent
DATA_DIR = Path(env_str("LINEAGE_DATA_DIR", str(BASE_DIR / ".data")))

DEBUG = env_bool("DEBUG", False)

SECRET_KEY = env_str("SECRET_KEY", None)
if not SECRET_KEY:
    if not DEBUG:
        raise ImproperlyConfigured(
            "SECRET_KEY is required when DEBUG is off. `make run` generates one under .data/; "
            "in production set it to a long random string."
        )
    SECRET_KEY = "django-insecure-development-only-key-never-use-in-production"  # noqa: S105

ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", ["127.0.0.1", "localhost", "[::1]"] if DEBUG else [])
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS", [])

INSTALLED_APPS = [
    "config.apps.LineageAdminConfig",  # django.contrib.admin with the operator console's site
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django.contrib.postgres",
    "rest_framework",
    "config.apps.ApiTokensConfig",  # knox
    "django_filters",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "config.apps.ConfigAppConfig",
    "workspaces",
    "durable",
    "knowledge",
    "workflows",
    "evals",
    "evolution",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "workspaces.api.errors.ApiNotFoundMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

# whitenoise serves static files under gunicorn, in `make run` (DEBUG: straight from the apps' static
# directories, no collectstatic) and in production (the collected, hashed files)
MIDDLEWARE.insert(1, "whitenoise.middleware.WhiteNoiseMiddleware")
WHITENOISE_USE_FINDERS = DEBUG
WHITENOISE_AUTOREFRESH = DEBUG

ROOT_URLCONF = "config.urls"
WSGI_APPLICATION = "config.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        # the project's admin pages (config/templates: package data, so an installed wheel has them)
        "DIRS": [BASE_DIR / "config" / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

DATABASE_URL = env_url("DATABASE_URL", None, schemes=("postgres", "postgresql", "pgsql"))
if DATABASE_URL is None:
    raise ImproperlyConfigured(
        "DATABASE_URL is not set. `make run`, `make test` and `python manage.py ...` start an embedded Postgres "
        "and set it; otherwise set DATABASE_URL=postgres://user:pass@host/db."
    )
# Each process (a gunicorn worker, a Celery pool process, beat, a manage.py command) opens at most
# DATABASE_POOL_MAX_SIZE connections, whatever its number of threads: a request or task borrows one for
# its duration and gives it back, and waits up to DATABASE_POOL_TIMEOUT seconds when all are busy. So
# the whole installation needs at most (web workers + Celery processes + beat) x the pool size
# connections (see README, "Connections"), bounded by configuration rather than by traffic.
# DATABASE_POOL_MAX_SIZE=0 turns the pool off (then DATABASE_CONN_MAX_AGE applies: one connection per
# thread, kept that many seconds).
DATABASE_POOL_MAX_SIZE = env_int("DATABASE_POOL_MAX_SIZE", 4, minimum=0, maximum=1000)
DATABASE_POOL_MIN_SIZE = env_int("DATABASE_POOL_MIN_SIZE", 1, minimum=0, maximum=DATABASE_POOL_MAX_SIZE or 1000)
DATABASE_POOL_TIMEOUT = env_float("DATABASE_POOL_TIMEOUT", 10.0, minimum=0.1)
DATABASES = {
    "default": dj_database_url.parse(
        DATABASE_URL,
        # the pool needs CONN_MAX_AGE 0: a connection goes back to the pool when Django closes it
        conn_max_age=0 if DATABASE_POOL_MAX_SIZE else env_int("DATABASE_CONN_MAX_AGE", 60, minimum=0),
        conn_health_checks=True,
    )
}
DATABASES["default"].setdefault("OPTIONS", {})
if DATABASE_POOL_MAX_SIZE:
    DATABASES["default"]["OPTIONS"]["pool"] = {
        "min_size": DATABASE_POOL_MIN_SIZE, "max_size": DATABASE_POOL_MAX_SIZE, "timeout": DATABASE_POOL_TIMEOUT,
        # idle connections above min_size are closed after a minute
        "max_idle": 60.0,
    }
# The engine's per-turn statements (durable/store.py, run through server-side-binding cursors) are prepared
# once a connection: Django leaves prepared statements off unless told (for poolers that cannot keep them),
# and then every turn's claim, replay and checkpoints were parsed and planned again. PgBouncer in transaction
# mode before 1.21 (or without max_prepared_statements) cannot keep them: DATABASE_PREPARED_STATEMENTS=false.
# Django's own queries bind client-side and are never prepared either way.
DATABASE_PREPARED_STATEMENTS = env_bool("DATABASE_PREPARED_STATEMENTS", True)
DATABASES["default"]["OPTIONS"]["prepare_threshold"] = 5 if DATABASE_PREPARED_STATEMENTS else None
DATABASES["default"]["TEST"] = {"NAME": env_str("DATABASE_TEST_NAME", None)}

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

LANGUAGE_CODE = "en-us"
FORMAT_MODULE_PATH = ["config.formats"]  # dates as Y-m-d H:i:s on every page (config/formats/en/formats.py)
TIME_ZONE = env_str("TIME_ZONE", "UTC")
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = Path(env_str("STATIC_ROOT", str(BASE_DIR / "staticfiles")))
MEDIA_URL = "media/"
MEDIA_ROOT = Path(env_str("MEDIA_ROOT", str(DATA_DIR / "media")))
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {
        "BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"
        if DEBUG
        else "whitenoise.storage.CompressedManifestStaticFilesStorage"
    },
}

LOGIN_URL = "admin:login"

# Secrets stored in the database (MCP server credentials, provider keys) are encrypted with this key.
# Several comma-separated keys allow rotation: the first encrypts, all decrypt.
FIELD_ENCRYPTION_KEYS = env_list("FIELD_ENCRYPTION_KEYS", [])

REDIS_URL = env_url("REDIS_URL", None, schemes=("redis", "rediss", "unix"))
if REDIS_URL is None:
    raise ImproperlyConfigured(
        "REDIS_URL is not set. `make run` and `make test` start an embedded Redis and set it; "
        "otherwise set REDIS_URL=redis://host:6379/0."
    )


def _next_database(url: str) -> str:
    """REDIS_URL's next database number (redis://host:6379/0 -> /1; unix://path?db=0 -> db=1)."""
    parts = urlsplit(url)
    if parts.scheme == "unix":
        query = dict(parse_qsl(parts.query))
        query["db"] = str(int(query.get("db") or 0) + 1)
        return urlunsplit(parts._replace(query=urlencode(query)))
    return urlunsplit(parts._replace(path=f"/{int(parts.path.strip('/') or 0) + 1}"))


# Django's cache (the API's throttle counts, the engine's tick heartbeat, the health probe's last worker
# ping): shared by every process, so on Redis; in a database of its own (by default REDIS_URL's next one),
# so clearing it (cache.clear() is FLUSHDB) never drops Celery's queued messages.
CACHE_URL = env_url("CACHE_URL", _next_database(REDIS_URL), schemes=("redis", "rediss", "unix"))
CACHES = {
    "default": {
        "BACKEND": "django.core.cache.backends.redis.RedisCache",
        "LOCATION": CACHE_URL,
        "KEY_PREFIX": "lineage",
        # a Redis that stops answering costs a request a second at most, never a hung worker
        "OPTIONS": {"socket_connect_timeout": 1, "socket_timeout": 1},
    }
}

# /healthz/ready is degraded (503) when the engine's last tick is older than this (beat sends one a
# second), or when no Celery worker has answered a ping for this long (probes ping at most every third of
# it, across all web processes, waiting HEALTH_WORKER_PING_TIMEOUT for answers)
HEALTH_TICK_MAX_AGE_SECONDS = env_float("HEALTH_TICK_MAX_AGE_SECONDS", 30.0, minimum=2.0)
HEALTH_WORKER_MAX_AGE_SECONDS = env_float("HEALTH_WORKER_MAX_AGE_SECONDS", 60.0, minimum=3.0)
HEALTH_WORKER_PING_TIMEOUT = env_float("HEALTH_WORKER_PING_TIMEOUT", 1.0, minimum=0.05)

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        # the token class first, so an unauthenticated request gets 401 with a WWW-Authenticate header
        "knox.auth.TokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    # refuse JSON nested too deeply and NUL characters with a 400 (see workspaces/api/parsers.py)
    "DEFAULT_PARSER_CLASSES": [
        "workspaces.api.parsers.JSONParser",
        "workspaces.api.parsers.FormParser",
        "workspaces.api.parsers.MultiPartParser",
    ],
    "DEFAULT_PAGINATION_CLASS": "workspaces.api.pagination.IdCursorPagination",
    # JSON, and DRF's browsable pages with a link to the admin's page of what they show
    "DEFAULT_RENDERER_CLASSES": [
        "rest_framework.renderers.JSONRenderer",
        "workspaces.api.renderers.LinkedBrowsableAPIRenderer",
    ],
    "PAGE_SIZE": 50,
    "DEFAULT_FILTER_BACKENDS": ["django_filters.rest_framework.DjangoFilterBackend"],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "EXCEPTION_HANDLER": "workspaces.api.errors.exception_handler",
    # rate limits, counted in the cache (Redis: shared by every web process); past one a client gets 429
    # with Retry-After in the API's error body (workspaces/api/throttles.py)
    "DEFAULT_THROTTLE_CLASSES": ["workspaces.api.throttles.WriteRateThrottle"],
    "DEFAULT_THROTTLE_RATES": {
        # POST /api/auth/token/ per client address, whatever the outcome: password guessing is slowed down
        "login": env_rate("API_THROTTLE_LOGIN_RATE", "10/minute"),
        # creates, updates, deletes and actions per user (per address when anonymous); reads are not limited
        "write": env_rate("API_THROTTLE_WRITE_RATE", "600/minute"),
    },
    # the client address behind this many proxies (X-Forwarded-For); 0: REMOTE_ADDR
    "NUM_PROXIES": env_int("API_NUM_PROXIES", 0, minimum=0),
    "TEST_REQUEST_DEFAULT_FORMAT": "json",
}

# API tokens are stored as hashes (knox), expire, and can be revoked one by one or all at once.
REST_KNOX = {
    "TOKEN_TTL": timedelta(days=env_int("API_TOKEN_TTL_DAYS", 30, minimum=1)),
    "AUTO_REFRESH": True,
    "AUTH_HEADER_PREFIX": "Token",
}

SPECTACULAR_SETTINGS = {
    "TITLE": "Lineage API",
    "DESCRIPTION": "Durable, self-improving agent workflows: workspaces, durable runs, workflows, "
    "knowledge, evaluations and evolution. Every list is scoped to the caller's workspaces.",
    "VERSION": "0.1.0",
    "SERVE_INCLUDE_SCHEMA": False,
    "COMPONENT_SPLIT_REQUEST": True,
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "POSTPROCESSING_HOOKS": ["drf_spectacular.hooks.postprocess_schema_enums",
                             "workspaces.api.schema.add_error_responses"],
    # several apps have a `status` or an `operation`: name each enum after its model, not a hash
    "ENUM_NAME_OVERRIDES": {
        "RunStatusEnum": "durable.models.DurableRun.Status",
        "WorkflowVersionStatusEnum": "workflows.models.WorkflowVersion.Status",
        "InvocationStatusEnum": "workflows.models.InvocationStatus",
        "WorkflowVersionOperationEnum": "workflows.models.WorkflowVersion.Operation",
        "EvalRunStatusEnum": "evals.models.EvalRunStatus",
        "EvalRunOriginEnum": "evals.models.EvalRun.Origin",
        "VersionActivationKindEnum": "workflows.models.VersionActivation.Kind",
        "KnowledgeSourceKindEnum": "knowledge.models.KnowledgeSource.Kind",
    },
}

# Production hardening: on whenever DEBUG is off, so `manage.py check --deploy` passes.
if not DEBUG:
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    SECURE_SSL_REDIRECT = env_bool("SECURE_SSL_REDIRECT", True)
    SECURE_HSTS_SECONDS = env_int("SECURE_HSTS_SECONDS", 31_536_000, minimum=0)
    SECURE_HSTS_INCLUDE_SUBDOMAINS = True
    SECURE_HSTS_PRELOAD = env_bool("SECURE_HSTS_PRELOAD", True)
    SESSION_COOKIE_SECURE = True
    CSRF_COOKIE_SECURE = True
    # probes and Prometheus's scrapes come from inside the deployment, over plain HTTP
    SECURE_REDIRECT_EXEMPT = [r"^healthz(/live|/ready)?$", r"^metrics$"]

# Prometheus scrapes, when OTEL_METRICS_EXPORTER names prometheus (config/telemetry.py; README, "Observability"):
# the web process answers GET /metrics, only with `Authorization: Bearer <METRICS_TOKEN>` when that is set;
# each Celery process and beat serve theirs on METRICS_PROMETHEUS_HOST, at METRICS_PROMETHEUS_PORT plus their
# kind's offset (config.telemetry.SCRAPE_PORT_OFFSETS: beat +0, tick worker +1, llm worker +2, a turn
# worker's prefork children +10, +11...)
METRICS_PROMETHEUS_HOST = env_str("METRICS_PROMETHEUS_HOST", "127.0.0.1")
METRICS_PROMETHEUS_PORT = env_int("METRICS_PROMETHEUS_PORT", 9464, minimum=1, maximum=65_000)
METRICS_TOKEN = env_str("METRICS_TOKEN", "")

# "plain" (`make run`'s terminal) or "json": one JSON object a line with the run, invocation, workspace and
# Celery task it comes from (config/logging.py), for a log pipeline (Loki, Elasticsearch, CloudWatch)
LOG_FORMAT = env_choice("LOG_FORMAT", "plain", choices=("plain", "json"))
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"},
                   "json": {"()": "config.logging.JsonFormatter"}},
    "filters": {"quiet_periodic_tasks": {"()": "config.logging.QuietPeriodicTasks"},
                "log_context": {"()": "config.logging.LogContextFilter"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": LOG_FORMAT,
                             "filters": ["log_context"]}},
    "root": {"handlers": ["console"], "level": env_str("LOG_LEVEL", "INFO")},
    "loggers": {
        "django.db.backends": {"level": "WARNING"},
        # the HTTP clients' line per request (every model and embedding call): a call's span, metrics and the
        # invocation's transcript say more; their warnings and errors still show
        "httpx": {"level": "WARNING"},
        "httpx2": {"level": "WARNING"},
        # the 1 s tick: INFO only when it did something (config/logging.py)
        "celery.app.trace": {"filters": ["quiet_periodic_tasks"]},
        "celery.worker.strategy": {"filters": ["quiet_periodic_tasks"]},
        "celery.beat": {"filters": ["quiet_periodic_tasks"]},
    },
}

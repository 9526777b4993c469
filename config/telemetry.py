"""OpenTelemetry traces and metrics: GenAI semantic conventions, one trace per durable run.

Off unless configured, as the OpenTelemetry conventions say: tracing starts only when
``OTEL_EXPORTER_OTLP_ENDPOINT`` (or ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``) or ``OTEL_TRACES_EXPORTER``
(``otlp``, ``console``, ``none``) is set, metrics likewise with ``OTEL_METRICS_EXPORTER``; the SDK reads
its own variables (``OTEL_SERVICE_NAME``, default ``lineage``, ``OTEL_EXPORTER_OTLP_HEADERS``...).
``setup()`` runs once a process (the WSGI application, each Celery worker process, beat, a management
command); with nothing configured it imports no SDK and every span here is the API's no-op span.

With ``OTEL_METRICS_EXPORTER`` naming ``prometheus``, each process keeps its metrics in its own
prometheus-client registry for scraping (a scrape reads one process; prometheus-client's multiprocess
mode does not apply to OpenTelemetry's reader): the web process answers ``GET /metrics``, every Celery
process and beat serve theirs on a port of their own, ``METRICS_PROMETHEUS_PORT`` plus their kind's
offset in ``SCRAPE_PORT_OFFSETS`` plus a prefork child's pool index, so the processes of one host never
want the same port.

A durable run is one trace, whatever process turns it: the run is stored with the W3C traceparent of
its ``durable.start`` span (a child of the API request's span, or of the parent run's turn, when there
is one), and every ``durable.turn`` and ``durable.step`` of the run continues it (a replay on another
worker, a retry after a crash). Spans of work that outlives a turn (an invocation, a node, an eval run)
are recorded once, when that work ends, where it really ends (the idempotent write that ends it, never
a replay), with the time it began; their span ids are derived from the trace id and a key naming the
work (``invocation:7``, ``invocation:7:node:2``), so what runs inside them on any worker before they
end (a model call in a queued step, a tool call) names them as its parent. The README's Observability
section lists the spans and metrics.
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import json
import logging
import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime

from django.core.exceptions import ImproperlyConfigured
from opentelemetry import context as otel_context
from opentelemetry import metrics, trace
from opentelemetry.trace import NonRecordingSpan, SpanContext, SpanKind, Status, StatusCode, TraceFlags
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

# The GenAI conventions are at development status: the attributes below follow this schema version
SCHEMA_URL = "https://opentelemetry.io/schemas/1.37.0"
INSTRUMENTATION_NAME = "lineage"
DEFAULT_SERVICE_NAME = "lineage"
EXPORTERS = {"traces": ("otlp", "console", "none"), "metrics": ("otlp", "console", "prometheus", "none")}
# a process kind's first scrape port past METRICS_PROMETHEUS_PORT; a prefork worker's child adds its pool index
SCRAPE_PORT_OFFSETS = {"beat": 0, "tick": 1, "llm": 2, "worker": 10}
# the GenAI conventions' advised bucket boundaries (seconds, tokens), for every histogram here: the SDK's
# defaults (0, 5, 10, 25...) put nearly every turn and model call in one bucket, leaving no quantile to read
DURATION_BUCKETS = (0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92)
TOKEN_BUCKETS = (1.0, 4.0, 16.0, 64.0, 256.0, 1024.0, 4096.0, 16384.0, 65536.0, 262144.0, 1048576.0, 4194304.0,
                 16777216.0, 67108864.0)  # floats, so Prometheus's `le` reads 16.0 as in every other histogram
CAPTURE_CONTENT_ENV = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"

_propagator = TraceContextTextMapPropagator()
_lock = threading.Lock()
logger = logging.getLogger("config.telemetry")


@dataclass
class _Installed:
    tracer_provider: object | None = None
    meter_provider: object | None = None
    tracer: object | None = None
    instruments: _Instruments | None = None
    pid: int | None = None  # the process setup() ran in (a forked child sets up its own)
    scrape_registry: object | None = None  # the prometheus-client registry of this process's metrics


_state = _Installed()
_proxy_tracer = trace.get_tracer(INSTRUMENTATION_NAME, schema_url=SCHEMA_URL)
# the traceparent of the durable run being turned or stepped in this thread (its durable.start span)
_run_trace: contextvars.ContextVar[str] = contextvars.ContextVar("lineage_run_trace", default="")
# the span id the next span started in this thread takes (see _KeyedIdGenerator)
_forced_span_id: contextvars.ContextVar[int | None] = contextvars.ContextVar("lineage_span_id", default=None)


# ------------------------------------------------------------------------------------ configuration


def _exporters(signal: str) -> tuple[str, ...]:
    variable = f"OTEL_{signal.upper()}_EXPORTER"
    raw = (os.environ.get(variable) or "").strip().lower()
    names = tuple(name.strip() for name in raw.split(",") if name.strip())
    unknown = [name for name in names if name not in EXPORTERS[signal]]
    if unknown:
        raise ImproperlyConfigured(f"{variable}={raw!r} is not valid: use {', '.join(EXPORTERS[signal])} "
                                   f"(comma-separated), not {', '.join(unknown)}.")
    return names


def _configured(signal: str) -> tuple[str, ...]:
    """The exporters of `signal` ("traces" or "metrics") the environment asks for; () when off."""
    if (os.environ.get("OTEL_SDK_DISABLED") or "").strip().lower() == "true":
        return ()
    names = _exporters(signal)
    if names:
        return tuple(name for name in names if name != "none")
    endpoint = os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or os.environ.get(
        f"OTEL_EXPORTER_OTLP_{signal.upper()}_ENDPOINT")
    return ("otlp",) if (endpoint or "").strip() else ()


def tracing_configured() -> bool:
    return bool(_configured("traces"))


def metrics_configured() -> bool:
    return bool(_configured("metrics"))


def scrapes_configured() -> bool:
    """Whether the metrics are kept for Prometheus to scrape (``OTEL_METRICS_EXPORTER`` naming prometheus)."""
    return "prometheus" in _configured("metrics")


def _resource():
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource

    # Resource.create reads OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES over these defaults
    defaults = {} if os.environ.get("OTEL_SERVICE_NAME") else {SERVICE_NAME: DEFAULT_SERVICE_NAME}
    return Resource.create(defaults)


def build_tracer_provider(*, span_exporter=None):
    """A TracerProvider with the exporters the environment names (batched), or with `span_exporter`
    alone, synchronous (tests). Its id generator gives keyed spans their derived ids."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor

    provider = TracerProvider(resource=_resource(), id_generator=_keyed_id_generator())
    if span_exporter is not None:
        provider.add_span_processor(SimpleSpanProcessor(span_exporter))
        return provider
    for name in _configured("traces"):
        if name == "console":
            from opentelemetry.sdk.trace.export import ConsoleSpanExporter

            exporter = ConsoleSpanExporter()
        else:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            exporter = OTLPSpanExporter()
        provider.add_span_processor(BatchSpanProcessor(exporter))
    return provider


def build_meter_provider(*, metric_reader=None, scrape_registry=None):
    """A MeterProvider exporting periodically to the exporters the environment names (``prometheus``: kept
    in `scrape_registry`, prometheus-client's global REGISTRY by default, for scrapes), or read by
    `metric_reader` alone (tests)."""
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader

    readers = [metric_reader] if metric_reader is not None else []
    if metric_reader is None:
        for name in _configured("metrics"):
            if name == "prometheus":
                from opentelemetry.exporter.prometheus import PrometheusMetricReader
                from prometheus_client import REGISTRY

                readers.append(PrometheusMetricReader(registry=scrape_registry or REGISTRY))
                continue
            if name == "console":
                from opentelemetry.sdk.metrics.export import ConsoleMetricExporter

                exporter = ConsoleMetricExporter()
            else:
                from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter

                exporter = OTLPMetricExporter()
            readers.append(PeriodicExportingMetricReader(exporter))
    return MeterProvider(resource=_resource(), metric_readers=readers)


def _keyed_id_generator():
    from opentelemetry.sdk.trace.id_generator import RandomIdGenerator

    class KeyedIdGenerator(RandomIdGenerator):
        """Random ids, except for a keyed span (``record_span``), whose id is derived from its key."""

        def generate_span_id(self) -> int:
            forced = _forced_span_id.get()
            return forced if forced is not None else super().generate_span_id()

    return KeyedIdGenerator()


def setup(*, instrument: tuple[str, ...] = ("django", "celery", "psycopg"), scrape_port: int | None = None) -> bool:
    """Set up tracing and metrics for this process when the environment configures them (once a process;
    a forked child sets up its own, so its batch exporter has its own thread). Instruments Django
    (`instrument` naming "django"), Celery and psycopg. With Prometheus scrapes configured, a process given
    a `scrape_port` (``scrape_port()``: a Celery process, beat) serves its metrics there; the web process
    answers ``/metrics`` instead. Returns whether anything is exported."""
    with _lock:
        if _state.pid == os.getpid():
            return _state.tracer_provider is not None or _state.meter_provider is not None
        _state.pid = os.getpid()
        tracer_provider = build_tracer_provider() if tracing_configured() else None
        meter_provider = build_meter_provider() if metrics_configured() else None
        if tracer_provider is None and meter_provider is None:
            return False
        if tracer_provider is not None:
            trace.set_tracer_provider(tracer_provider)
        if meter_provider is not None:
            metrics.set_meter_provider(meter_provider)
        registry = None
        if scrapes_configured():
            import prometheus_client

            registry = prometheus_client.REGISTRY  # where build_meter_provider's Prometheus reader writes
        install(tracer_provider=tracer_provider, meter_provider=meter_provider, scrape_registry=registry)
        if tracer_provider is not None:
            _instrument(instrument, tracer_provider, meter_provider)
        if registry is not None and scrape_port is not None:
            serve_scrapes(port=scrape_port)
        return True


def scrape_port(kind: str, index: int = 0) -> int:
    """The port a process of `kind` (a key of SCRAPE_PORT_OFFSETS) serves its metrics on; `index`: a prefork
    worker child's index in its pool (a replaced child takes the index, and so the port, of the one it
    replaces)."""
    from django.conf import settings

    return settings.METRICS_PROMETHEUS_PORT + SCRAPE_PORT_OFFSETS[kind] + index


def serve_scrapes(*, port: int, host: str | None = None):
    """Serve this process's metrics to Prometheus on `host` (METRICS_PROMETHEUS_HOST) and `port`, in a
    thread of prometheus-client's; returns its server, or None when the port is taken (logged: metrics
    never stop a worker)."""
    from django.conf import settings
    from prometheus_client import start_http_server

    host = host if host is not None else settings.METRICS_PROMETHEUS_HOST
    try:
        server, _thread = start_http_server(port, addr=host, registry=_state.scrape_registry)
    except OSError as exc:
        logger.warning("metrics are not served on %s:%s (%s): is another process on that port? "
                       "(METRICS_PROMETHEUS_PORT)", host, port, exc)
        return None
    return server


def scrapes_kept() -> bool:
    """Whether this process keeps its metrics for Prometheus's scrapes (``scrape``)."""
    return _state.scrape_registry is not None


def scrape(accept: str = "") -> tuple[bytes, str]:
    """This process's metrics as a Prometheus scrape in the format `accept` (a request's Accept header) asks
    for, and its content type (the text format 0.0.4 by default)."""
    from prometheus_client.exposition import choose_encoder

    encoder, content_type = choose_encoder(accept)
    return encoder(_state.scrape_registry), content_type


def _instrument(names: tuple[str, ...], tracer_provider, meter_provider) -> None:
    providers = {"tracer_provider": tracer_provider}
    if meter_provider is not None:
        providers["meter_provider"] = meter_provider
    if "django" in names:
        from opentelemetry.instrumentation.django import DjangoInstrumentor

        DjangoInstrumentor().instrument(**providers)
    if "celery" in names:
        from opentelemetry.instrumentation.celery import CeleryInstrumentor

        CeleryInstrumentor().instrument(**providers)
    if "psycopg" in names:
        from opentelemetry.instrumentation.psycopg import PsycopgInstrumentor

        PsycopgInstrumentor().instrument(**providers, skip_dep_check=True)


def install(*, tracer_provider=None, meter_provider=None, scrape_registry=None) -> _Installed:
    """Use these providers for Lineage's own spans and metrics (None: the API's globals, no-ops unless
    something set them), and `scrape_registry` (the registry meter_provider's Prometheus reader writes to)
    for ``scrape``. Returns what was installed before, for ``restore``."""
    previous = _Installed(_state.tracer_provider, _state.meter_provider, _state.tracer, _state.instruments, _state.pid,
                          _state.scrape_registry)
    _state.tracer_provider, _state.meter_provider = tracer_provider, meter_provider
    _state.scrape_registry = scrape_registry
    _state.tracer = tracer_provider.get_tracer(INSTRUMENTATION_NAME, schema_url=SCHEMA_URL) \
        if tracer_provider is not None else None
    _state.instruments = None
    return previous


def restore(previous: _Installed) -> None:
    _state.tracer_provider, _state.meter_provider = previous.tracer_provider, previous.meter_provider
    _state.tracer, _state.instruments, _state.pid = previous.tracer, previous.instruments, previous.pid
    _state.scrape_registry = previous.scrape_registry


def tracing() -> bool:
    """Whether Lineage's spans are recorded in this process (the checks that cost a query ask first)."""
    return _state.tracer_provider is not None


def tracer():
    return _state.tracer if _state.tracer is not None else _proxy_tracer


def flush(timeout_millis: int = 5000) -> None:
    """Export what is buffered now (a short-lived command before it exits; the tests)."""
    for provider in (_state.tracer_provider, _state.meter_provider):
        if provider is not None:
            provider.force_flush(timeout_millis)


# ------------------------------------------------------------------------------------ trace context


def traceparent(span=None) -> str:
    """The W3C traceparent of `span` (the current span by default), "" when it is not a recorded one."""
    span = span if span is not None else trace.get_current_span()
    if not span.get_span_context().is_valid:
        return ""
    carrier: dict[str, str] = {}
    _propagator.inject(carrier, context=trace.set_span_in_context(span))
    return carrier.get("traceparent", "")


def _context_of(traceparent_: str):
    """The context continuing `traceparent_` (the current context when it is empty or unreadable)."""
    if not traceparent_:
        return None
    extracted = _propagator.extract({"traceparent": traceparent_})
    return extracted if trace.get_current_span(extracted).get_span_context().is_valid else None


def run_start_context(*, run_id: str, workflow: str) -> str:
    """The traceparent a new durable run is stored with: its ``durable.start`` span's, a child of the
    current span (an API request, the parent run's turn) when there is one. "" with tracing off."""
    if not tracing():
        return ""
    span = tracer().start_span("durable.start", attributes={"durable.run.id": run_id, "durable.workflow": workflow})
    span.end()
    return traceparent(span)


@contextlib.contextmanager
def _run_scope(name: str, trace_context: str, attributes: dict, histogram: str) -> Iterator[_Scope]:
    scope = _Scope(attributes={"durable.workflow": attributes.get("durable.workflow", "")})
    if not tracing() and _state.meter_provider is None:
        yield scope
        return
    token = _run_trace.set(trace_context)
    started = time.perf_counter()
    try:
        with tracer().start_as_current_span(name, context=_context_of(trace_context), attributes=attributes) as span:
            scope.span = span
            try:
                yield scope
            except BaseException as exc:
                scope.outcome = scope.outcome or type(exc).__name__
                raise
            finally:
                if scope.outcome:
                    span.set_attribute(scope.attribute, scope.outcome)
    finally:
        _run_trace.reset(token)
        getattr(instruments(), histogram).record(time.perf_counter() - started, {
            **scope.attributes, scope.attribute: scope.outcome or "unknown"})


@dataclass
class _Scope:
    attributes: dict
    attribute: str = "durable.turn.outcome"
    outcome: str = ""
    span: object = None

    def ended(self, result, *, error: str | dict = ""):
        """Record `result`'s outcome (a TurnResult, or a step's status) and give it back; a failed turn's
        error (or a step's `error`) sets the span's status."""
        self.outcome = str(getattr(result, "outcome", result))
        failure = getattr(result, "error", None) or error
        if failure and self.span is not None:
            message = failure.get("message", "") if isinstance(failure, dict) else str(failure)
            kind = failure.get("type", "") if isinstance(failure, dict) else ""
            self.span.set_status(Status(StatusCode.ERROR, f"{kind}: {message}"[:1000] if kind else message[:1000]))
            if kind:
                self.span.set_attribute("error.type", kind)
        return result


def durable_turn(*, run_id: str, workflow: str, trace_context: str):
    """The span (``durable.turn``) and latency of one turn, continuing the run's trace; ``.ended(result)``
    records its outcome."""
    return _run_scope("durable.turn", trace_context, {"durable.run.id": run_id, "durable.workflow": workflow},
                      "turn_duration")


@contextlib.contextmanager
def durable_step(*, run_id: str, name: str, attempt: int, trace_context: str) -> Iterator[_Scope]:
    """The span (``durable.step``) and latency of one queued step's attempt; ``.ended(status)`` records
    how it settled."""
    with _run_scope("durable.step", trace_context, {"durable.run.id": run_id, "durable.step.name": name,
                                                    "durable.step.attempt": attempt}, "step_duration") as scope:
        scope.attribute = "durable.step.status"
        scope.attributes = {"durable.step.name": _step_kind(name)}
        yield scope


def _step_kind(name: str) -> str:
    """A step's name without its numbers (``node:3:llm:0`` -> ``node:llm``), so metrics stay low-cardinality."""
    return ":".join(part for part in name.split(":") if not part.replace(".", "").isdigit())[:100]


def _trace_id() -> int:
    """The trace of the run in hand (its stored context), else the current span's; 0 for none."""
    parent = _context_of(_run_trace.get())
    span_context = trace.get_current_span(parent).get_span_context()
    return span_context.trace_id if span_context.is_valid else 0


def _span_id(trace_id: int, key: str) -> int:
    digest = hashlib.blake2b(f"{trace_id:032x}/{key}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") or 1


@contextlib.contextmanager
def under(key: str) -> Iterator[None]:
    """Make the keyed span `key` (recorded later by ``record_span``) the parent of the spans started in
    the block: a node's model and tool calls, on whichever worker runs them."""
    trace_id = _trace_id() if tracing() else 0
    if not trace_id:
        yield
        return
    parent = SpanContext(trace_id, _span_id(trace_id, key), is_remote=True, trace_flags=TraceFlags(TraceFlags.SAMPLED))
    token = otel_context.attach(trace.set_span_in_context(NonRecordingSpan(parent)))
    try:
        yield
    finally:
        otel_context.detach(token)


def record_span(name: str, *, key: str, start: datetime | None, parent_key: str | None = None,
                trace_context: str | None = None, attributes: dict | None = None, error: str = "",
                error_type: str = "", kind: SpanKind = SpanKind.INTERNAL) -> None:
    """Record the finished span of work that began at `start` and ends now, under the id ``under(key)``
    gave its children. Its parent is the keyed span `parent_key`, else the run's stored context
    (`trace_context`, by default that of the run being turned). An `error` (a message) sets its status,
    `error_type` its ``error.type``."""
    if not tracing():
        return
    stored = _context_of(trace_context if trace_context is not None else _run_trace.get())
    trace_id = trace.get_current_span(stored).get_span_context().trace_id if stored is not None else _trace_id()
    if not trace_id:
        return
    parent = stored
    if parent_key is not None:
        parent = trace.set_span_in_context(NonRecordingSpan(SpanContext(
            trace_id, _span_id(trace_id, parent_key), is_remote=True, trace_flags=TraceFlags(TraceFlags.SAMPLED))))
    elif parent is None:
        parent = trace.set_span_in_context(NonRecordingSpan(trace.get_current_span().get_span_context()))
    token = _forced_span_id.set(_span_id(trace_id, key))
    try:
        span = tracer().start_span(name, context=parent, kind=kind, attributes=attributes,
                                   start_time=int(start.timestamp() * 1e9) if start is not None else None)
    finally:
        _forced_span_id.reset(token)
    if error:
        span.set_status(Status(StatusCode.ERROR, error[:1000]))
        span.set_attribute("error.type", error_type or "_OTHER")
    span.end()


# ----------------------------------------------------------------------------------------- model calls


def capture_content() -> bool:
    return (os.environ.get(CAPTURE_CONTENT_ENV) or "").strip().lower() == "true"


def _parts(message: dict) -> list[dict]:
    parts = []
    content = message.get("content")
    if isinstance(content, str) and content:
        parts.append({"type": "text", "content": content})
    elif isinstance(content, list):
        parts.extend({"type": "text", "content": part.get("text", "")} for part in content if isinstance(part, dict))
    for call in message.get("tool_calls") or ():
        function = call.get("function") or {}
        parts.append({"type": "tool_call", "id": call.get("id", ""), "name": function.get("name", ""),
                      "arguments": function.get("arguments", "")})
    if message.get("role") == "tool":
        parts = [{"type": "tool_call_response", "id": message.get("tool_call_id", ""), "response": content or ""}]
    return parts


def input_messages(messages: list[dict]) -> str:
    """OpenAI-format messages as the conventions' ``gen_ai.input.messages`` JSON."""
    return json.dumps([{"role": message.get("role", "user"), "parts": _parts(message)} for message in messages],
                      ensure_ascii=False)


def output_messages(message: dict, finish_reason: str) -> str:
    return json.dumps([{"role": "assistant", "parts": _parts(message), "finish_reason": finish_reason}],
                      ensure_ascii=False)


class _Call:
    """What ``chat_span`` knows of a model call: the span, and the attributes its metrics carry."""

    def __init__(self, span, attributes: dict):
        self.span, self.attributes, self.outcome = span, attributes, "error"
        self.error_type = ""

    def answered(self, response) -> None:
        """Record the answer: the model that gave it, tokens, finish reason, USD and, when asked, content."""
        self.outcome = "ok"
        usage = response.usage
        self.attributes["gen_ai.response.model"] = usage.model
        self.span.set_attributes({
            "gen_ai.response.model": usage.model, "gen_ai.usage.input_tokens": usage.input_tokens,
            "gen_ai.usage.output_tokens": usage.output_tokens,
            "gen_ai.response.finish_reasons": [response.finish_reason], "lineage.usd_cost": float(usage.usd_cost)})
        if capture_content() and self.span.is_recording():
            self.span.set_attribute("gen_ai.output.messages", output_messages(response.assistant_message(),
                                                                              response.finish_reason))
        meters = instruments()
        for kind, count in (("input", usage.input_tokens), ("output", usage.output_tokens)):
            meters.token_usage.record(count, {**self.attributes, "gen_ai.token.type": kind})
        meters.cost.add(float(usage.usd_cost), self._model_attributes())

    def throttled(self, kind: str, reason: str, *, error_type: str) -> None:
        """The provider refused the call (a 429, a 5xx) and it is put off: its span keeps the error."""
        self.outcome, self.error_type = "throttled", error_type
        self.span.set_attributes({"lineage.llm.put_off": kind, "lineage.llm.put_off_reason": reason[:500]})
        llm_throttled(provider=self.attributes["gen_ai.provider.name"], model=self.attributes["gen_ai.request.model"],
                      kind=kind)

    def _model_attributes(self) -> dict:
        return {name: self.attributes[name] for name in ("gen_ai.provider.name", "gen_ai.request.model")}


@contextlib.contextmanager
def chat_span(request, *, provider: str, model: str) -> Iterator[_Call]:
    """The ``chat {model}`` client span, latency, in-flight count and usage of one model call as the
    provider is asked (never for an answer from a cache or a checkpoint)."""
    attributes = {"gen_ai.operation.name": "chat", "gen_ai.provider.name": provider, "gen_ai.request.model": model}
    span_attributes = dict(attributes)
    if request.temperature is not None:
        span_attributes["gen_ai.request.temperature"] = float(request.temperature)
    if request.max_tokens:
        span_attributes["gen_ai.request.max_tokens"] = int(request.max_tokens)
    meters = instruments()
    started = time.perf_counter()
    with tracer().start_as_current_span(f"chat {model}", kind=SpanKind.CLIENT, attributes=span_attributes) as span:
        if capture_content() and span.is_recording():
            span.set_attribute("gen_ai.input.messages", input_messages(request.messages))
        call = _Call(span, attributes)
        meters.in_flight.add(1, call._model_attributes())
        try:
            yield call
        except Exception as exc:
            attributes["error.type"] = call.error_type or type(exc).__name__
            span.set_attribute("error.type", attributes["error.type"])
            raise
        finally:
            meters.in_flight.add(-1, call._model_attributes())
            meters.duration.record(time.perf_counter() - started, attributes)
            meters.calls.add(1, {**call._model_attributes(), "lineage.llm.outcome": call.outcome})


def llm_put_off(*, provider: str, model: str, reason: str) -> None:
    """A call a provider limit of this install put off before it was sent: not a call of the provider's, so
    no ``chat`` span, only an event on the current span (when it is a recording one) and the throttled count."""
    trace.get_current_span().add_event("lineage.llm.put_off", {
        "gen_ai.provider.name": provider, "gen_ai.request.model": model, "lineage.llm.put_off": "limit",
        "reason": reason[:500]})
    llm_throttled(provider=provider, model=model, kind="limit")


def llm_throttled(*, provider: str, model: str, kind: str) -> None:
    """Count a model call put off or made to wait: by a provider limit ("limit") or its refusal ("provider")."""
    instruments().throttled.add(1, {"gen_ai.provider.name": provider, "gen_ai.request.model": model,
                                    "lineage.llm.put_off": kind})


@contextlib.contextmanager
def tool_span(*, name: str, call_id: str) -> Iterator[object]:
    """The ``execute_tool {tool}`` span of one tool call as it really runs."""
    with tracer().start_as_current_span(f"execute_tool {name}", attributes={
            "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": name, "gen_ai.tool.call.id": call_id}) as span:
        yield span


# --------------------------------------------------------------------------------------------- metrics


@dataclass
class _Instruments:
    turn_duration: object
    step_duration: object
    duration: object
    token_usage: object
    calls: object
    cost: object
    throttled: object
    in_flight: object


def instruments() -> _Instruments:
    """The metric instruments, on the installed meter provider (the API's global, a no-op, otherwise)."""
    if _state.instruments is None:
        provider = _state.meter_provider if _state.meter_provider is not None else metrics.get_meter_provider()
        meter = provider.get_meter(INSTRUMENTATION_NAME, schema_url=SCHEMA_URL)
        _state.instruments = _Instruments(
            turn_duration=meter.create_histogram("lineage.durable.turn.duration", unit="s",
                                                 description="Durable turns, by workflow and outcome",
                                                 explicit_bucket_boundaries_advisory=DURATION_BUCKETS),
            step_duration=meter.create_histogram("lineage.durable.step.duration", unit="s",
                                                 description="Queued durable steps' attempts, by step and status",
                                                 explicit_bucket_boundaries_advisory=DURATION_BUCKETS),
            duration=meter.create_histogram("gen_ai.client.operation.duration", unit="s",
                                            description="Model calls as the provider is asked",
                                            explicit_bucket_boundaries_advisory=DURATION_BUCKETS),
            token_usage=meter.create_histogram("gen_ai.client.token.usage", unit="{token}",
                                               description="Tokens of model calls, by gen_ai.token.type",
                                               explicit_bucket_boundaries_advisory=TOKEN_BUCKETS),
            calls=meter.create_counter("lineage.llm.calls", unit="{call}",
                                       description="Model calls, by provider, model and outcome"),
            cost=meter.create_counter("lineage.llm.cost", unit="USD", description="USD of model calls"),
            throttled=meter.create_counter("lineage.llm.throttled", unit="{call}",
                                           description="Model calls put off by a limit or a provider's refusal"),
            in_flight=meter.create_up_down_counter("lineage.llm.calls.in_flight", unit="{call}",
                                                   description="Model calls waiting on their provider now"),
        )
    return _state.instruments

"""Durable runs and schedules over HTTP, scoped by namespace: a workspace's runs live in its
namespace ``ws-<pk>`` and a caller sees only the namespaces of their workspaces (anything else
is a 404). Events are published into one workspace's namespace and never reach another's runs."""

from __future__ import annotations

from django.db import connection, transaction
from django.db.models import Prefetch
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema, extend_schema_view
from rest_framework import exceptions, mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.response import Response

from config.errors import Conflict
from durable import selectors, services
from durable.api.filters import RunFilter, ScheduleFilter
from durable.api.serializers import (
    BulkResultSerializer,
    CancelSerializer,
    EventPublishSerializer,
    EventResultSerializer,
    FacetsSerializer,
    FanStatsSerializer,
    RetrySerializer,
    RunDetailSchemaSerializer,
    RunDetailSerializer,
    RunSerializer,
    RunStartSerializer,
    ScheduleSerializer,
    SignalResultSerializer,
    SignalSerializer,
    TimelineSerializer,
    api_startable,
    workspace_id_of,
)
from durable.errors import RunIdConflict, UnknownWorkflow
from durable.models import DurableRun, RunAttribute, Schedule
from workspaces.api.base import WorkspaceScopedMixin, member_namespaces
from workspaces.api.pagination import IdCursorPagination

TIMELINE_PAGE = 500
TIMELINE_MAX_PAGE = 5000


class RunCursorPagination(IdCursorPagination):
    """Newest first; the created_at index serves it and the id breaks ties."""

    ordering = ("-created_at", "-id")


class NamespaceScopedMixin(WorkspaceScopedMixin):
    """WorkspaceScopedMixin for rows scoped by durable namespace rather than a workspace foreign key."""

    def namespaces(self, *, write: bool = False):
        """Subquery of the caller's namespaces ("ws-<pk>"), optionally only where their role may write."""
        return member_namespaces(self.request.user, roles=self.write_roles if write else None)

    def get_queryset(self):
        queryset = super(WorkspaceScopedMixin, self).get_queryset()  # pyright: ignore[reportAttributeAccessIssue]: the viewset it is mixed into has one
        return queryset.filter(namespace__in=self.namespaces())

    def workspace_of(self, obj):
        return workspace_id_of(obj.namespace)


@extend_schema_view(
    list=extend_schema(summary="List runs", description="Cursor pages of runs, newest first, without payloads."),
    create=extend_schema(summary="Start a run", request=RunStartSerializer, responses={201: RunSerializer,
                                                                                       200: RunSerializer}),
    retrieve=extend_schema(summary="A run with decoded input, output and error",
                           responses=RunDetailSchemaSerializer),
)
class RunViewSet(NamespaceScopedMixin, mixins.ListModelMixin, viewsets.GenericViewSet):
    """Durable runs of the caller's workspaces (namespace "ws-<workspace id>"); others are 404."""

    queryset = DurableRun.objects.defer(*selectors.PAYLOAD_COLUMNS).prefetch_related(
        Prefetch("attributes", queryset=RunAttribute.objects.order_by("key")))
    serializer_class = RunSerializer
    filterset_class = RunFilter
    pagination_class = RunCursorPagination
    lookup_value_regex = "[^/]+(?:/[0-9]+)*"  # child runs are "<parent>/<seq>"

    def initial(self, request, *args, **kwargs):
        super().initial(request, *args, **kwargs)
        if "pk" in self.kwargs:  # the handler receives this same dict: every detail action sees the stored id
            self.kwargs["pk"] = self._stored_id(self.kwargs["pk"])

    def _stored_id(self, pk: str) -> str:
        """The caller's run id as stored: caller-chosen ids are per namespace ("<namespace>:<id>")."""
        names = list(self.namespaces().values_list("ns", flat=True))
        matches = selectors.run_ids_resolve(pk, namespaces=names)
        if len(matches) > 1 and matches[0] != pk:
            raise exceptions.ValidationError({"id": [f"{pk!r} names a run in several of your workspaces; "
                                                     f"use one of {', '.join(matches)}."]})
        return matches[0] if matches else pk

    def get_serializer_class(self):
        return {"create": RunStartSerializer, "signal": SignalSerializer, "cancel": CancelSerializer,
                "retry": RetrySerializer}.get(self.action, RunSerializer)

    def _filtered(self, *, write: bool = False):
        queryset = self.get_queryset()
        if write:
            queryset = queryset.filter(namespace__in=self.namespaces(write=True))
        return self.filter_queryset(queryset)

    # ------------------------------------------------------------------------------------ reads

    def retrieve(self, request, pk: str):
        detail = selectors.run_detail(pk, namespaces=self.namespaces())
        return Response(RunDetailSerializer(detail).data)

    @extend_schema(summary="Counts by status and by workflow over the list's filters", filters=True,
                   responses=FacetsSerializer)
    @action(detail=False, methods=["get"], pagination_class=None)
    def facets(self, request):
        return Response(selectors.facets_of(self._filtered()))

    @extend_schema(
        summary="A run's checkpoints in seq order, with queue and run durations",
        filters=False,
        parameters=[
            OpenApiParameter("payloads", OpenApiTypes.BOOL, description="Include decoded input, output and error."),
            OpenApiParameter("after", OpenApiTypes.INT, description="Checkpoints after this seq (from next_after)."),
            OpenApiParameter("limit", OpenApiTypes.INT, description=f"Page size, default {TIMELINE_PAGE}, "
                                                                     f"at most {TIMELINE_MAX_PAGE}."),
        ],
        responses=TimelineSerializer,
    )
    @action(detail=True, methods=["get"], pagination_class=None, filterset_class=None)
    def timeline(self, request, pk: str):
        params = request.query_params
        payloads = params.get("payloads", "0").lower() in {"1", "true", "yes"}
        after = _int_param(params, "after", None, minimum=-1)
        limit = _int_param(params, "limit", TIMELINE_PAGE, minimum=1, maximum=TIMELINE_MAX_PAGE)
        entries = selectors.run_timeline(pk, include_payloads=payloads, after_seq=after, limit=limit + 1,
                                         namespaces=self.namespaces())
        more = len(entries) > limit
        entries = entries[:limit]
        return Response(TimelineSerializer({"run": pk, "checkpoints": entries,
                                            "next_after": entries[-1].seq if more else None}).data)

    @extend_schema(
        summary="Per-fan statistics: counts, seq and time bounds and attempts by group, status and kind",
        filters=False,
        parameters=[OpenApiParameter("group", OpenApiTypes.INT, description="Only this parallel group.")],
        responses=FanStatsSerializer,
    )
    @action(detail=True, methods=["get"], url_path="fan-stats", pagination_class=None, filterset_class=None)
    def fan_stats(self, request, pk: str):
        group = _int_param(request.query_params, "group", None)
        buckets = selectors.fan_stats(pk, group, namespaces=self.namespaces())
        return Response(FanStatsSerializer({"run": pk, "buckets": buckets}).data)

    # ----------------------------------------------------------------------------------- writes

    def create(self, request):
        serializer = RunStartSerializer(data=request.data, context=self.get_serializer_context())
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        workspace = data["workspace"]
        self.check_write_role(workspace)
        run_id = data.get("run_id")
        if run_id:
            run_id = services.caller_run_id(namespace=workspace.namespace, run_id=run_id)
        existed = bool(run_id) and DurableRun.objects.filter(pk=run_id).exists()
        try:
            run = services.run_start(workflow=data["workflow"], input=data["input"], run_id=run_id,
                                     namespace=workspace.namespace, tags=data["tags"], priority=data["priority"])
        except UnknownWorkflow as exc:
            raise exceptions.ValidationError({"workflow": [str(exc)]}) from None
        except RunIdConflict:
            raise Conflict("A run with this id already exists.") from None
        except ValueError as exc:
            raise exceptions.ValidationError({"input": [str(exc)]}) from None
        run = self.get_queryset().get(pk=run.pk)
        return Response(RunSerializer(run).data, status=status.HTTP_200_OK if existed else status.HTTP_201_CREATED)

    def _writable_run(self, pk) -> DurableRun:
        run = self.get_object()
        self.check_write_role(self.workspace_of(run))
        return run

    @extend_schema(summary="Send a signal to an active run", responses={200: SignalResultSerializer})
    @action(detail=True, methods=["post"])
    def signal(self, request, pk=None):
        run = self._writable_run(pk)
        serializer = SignalSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        result = services.signal_send(run_id=run.pk, name=serializer.validated_data["name"],
                                      payload=serializer.validated_data["payload"])
        return Response({"result": result})

    @extend_schema(summary="Cancel an active run and its active descendants", responses=RunSerializer)
    @action(detail=True, methods=["post"])
    def cancel(self, request, pk=None):
        run = self._writable_run(pk)
        serializer = CancelSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        if not services.run_cancel(run_id=run.pk, reason=serializer.validated_data["reason"],
                                   compensate=serializer.validated_data["compensate"]):
            raise Conflict(f"Run {run.pk} is {self._status(run.pk)}; only pending, running or suspended runs "
                           "can be cancelled.")
        return Response(RunSerializer(self.get_queryset().get(pk=run.pk)).data)

    @extend_schema(summary="Retry a failed, cancelled or dead run (with `input`: start over with it)",
                   responses=RunSerializer)
    @action(detail=True, methods=["post"])
    def retry(self, request, pk=None):
        run = self._writable_run(pk)
        serializer = RetrySerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        new_input = "input" in serializer.validated_data
        if new_input and not api_startable(run.workflow):
            # starting over with an input of the caller's choosing is starting the workflow anew
            raise exceptions.ValidationError({"input": [f"{run.workflow} is started by the platform only; "
                                                        "retry it without a new input."]})
        if not services.run_retry(run_id=run.pk, input=serializer.validated_data.get("input"), new_input=new_input):
            raise Conflict(f"Run {run.pk} is {self._status(run.pk)}; only failed, cancelled or dead runs "
                           "can be retried.")
        return Response(RunSerializer(self.get_queryset().get(pk=run.pk)).data)

    @staticmethod
    def _status(run_id: str) -> str:
        return DurableRun.objects.filter(pk=run_id).values_list("status", flat=True).first() or "gone"

    def _bulk(self, request, eligible, apply):
        filterset = RunFilter(request.query_params, queryset=DurableRun.objects.none(), request=request)
        if filterset.is_valid() and not filterset.has_filters():
            raise exceptions.ValidationError({"filters": ["Give at least one of the list's filters "
                                                          "(for example ?status=failed)."]})
        queryset = self._filtered(write=True).filter(status__in=sorted(eligible)).order_by("created_at", "id")
        ids = list(queryset.values_list("id", flat=True)[:services.BULK_LIMIT + 1])
        more = len(ids) > services.BULK_LIMIT
        result = apply(ids[:services.BULK_LIMIT])
        return Response({**result, "limit": services.BULK_LIMIT, "more": more})

    @extend_schema(summary=f"Cancel up to {services.BULK_LIMIT} active runs matching the list's filters",
                   request=None, filters=True, responses=BulkResultSerializer)
    @action(detail=False, methods=["post"], url_path="bulk-cancel", pagination_class=None)
    def bulk_cancel(self, request):
        reason = str(request.data.get("reason") or "cancelled by an operator")[:500] \
            if isinstance(request.data, dict) else "cancelled by an operator"
        return self._bulk(request, DurableRun.Status.ACTIVE,
                          lambda ids: services.runs_bulk_cancel(run_ids=ids, reason=reason))

    @extend_schema(summary=f"Retry up to {services.BULK_LIMIT} failed, cancelled or dead runs matching the "
                           "list's filters", request=None, filters=True, responses=BulkResultSerializer)
    @action(detail=False, methods=["post"], url_path="bulk-retry", pagination_class=None)
    def bulk_retry(self, request):
        return self._bulk(request, DurableRun.Status.RETRYABLE,
                          lambda ids: services.runs_bulk_retry(run_ids=ids))


def _int_param(params, name: str, default, *, minimum: int | None = None, maximum: int | None = None):
    raw = params.get(name)
    if raw in (None, ""):
        return default
    try:
        value = int(raw)
    except ValueError:
        raise exceptions.ValidationError({name: ["Must be an integer."]}) from None
    if (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
        raise exceptions.ValidationError({name: [f"Must be between {minimum} and {maximum}."
                                                 if maximum is not None else f"Must be at least {minimum}."]})
    return value


@extend_schema_view(
    create=extend_schema(summary="Create a schedule (validated and saved through durable.services.schedule_save)"),
    partial_update=extend_schema(summary="Change a schedule; its key and workspace are fixed"),
)
class ScheduleViewSet(NamespaceScopedMixin, mixins.CreateModelMixin, mixins.UpdateModelMixin,
                      mixins.DestroyModelMixin, viewsets.ReadOnlyModelViewSet):
    """Schedules of the caller's workspaces; each window starts one run of `workflow` in the workspace."""

    queryset = Schedule.objects.all()
    serializer_class = ScheduleSerializer
    filterset_class = ScheduleFilter

    @staticmethod
    def _save(schedule: Schedule | None, namespace: str, data: dict) -> Schedule:
        def value(name, default):
            return data.get(name, getattr(schedule, name, default) if schedule is not None else default)

        return services.schedule_save(
            key=value("key", ""), workflow=value("workflow", ""), namespace=namespace, input=value("input", {}),
            every_seconds=value("every_seconds", None), cron=value("cron", ""),
            timezone_name=value("timezone", "UTC"), paused=value("paused", False), overlap=value("overlap", "allow"),
            jitter_seconds=value("jitter_seconds", 0), catchup_limit=value("catchup_limit", 1),
            tags=value("tags", []),
        )

    def perform_create(self, serializer):
        data = serializer.validated_data
        workspace = data["workspace"]
        self.check_write_role(workspace)
        with transaction.atomic():
            # schedule_save updates by (namespace, key): a create must not land on an existing schedule
            # (the lock serialises two creates of one key)
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))",
                               [f"durable:schedule:{workspace.namespace}:{data['key']}"])
            if Schedule.objects.filter(namespace=workspace.namespace, key=data["key"]).exists():
                raise exceptions.ValidationError({"key": ["A schedule with this key already exists."]})
            serializer.instance = self._save(None, workspace.namespace, data)

    def perform_update(self, serializer):
        schedule = serializer.instance
        self.check_write_role(self.workspace_of(schedule))
        serializer.instance = self._save(schedule, schedule.namespace, serializer.validated_data)

    def perform_destroy(self, instance):
        self.check_write_role(self.workspace_of(instance))
        instance.delete()

    @extend_schema(summary="Pause a schedule", request=None, responses=ScheduleSerializer)
    @action(detail=True, methods=["post"])
    def pause(self, request, pk=None):
        return self._set_paused(True)

    @extend_schema(summary="Resume a paused schedule (its next window is computed from now)", request=None,
                   responses=ScheduleSerializer)
    @action(detail=True, methods=["post"])
    def resume(self, request, pk=None):
        return self._set_paused(False)

    def _set_paused(self, paused: bool):
        schedule = self.get_object()
        self.check_write_role(self.workspace_of(schedule))
        schedule = self._save(schedule, schedule.namespace, {"paused": paused})
        return Response(ScheduleSerializer(schedule, context=self.get_serializer_context()).data)


class EventViewSet(NamespaceScopedMixin, viewsets.GenericViewSet):
    """Publish an event to the runs of one of your workspaces that wait for it (`ctx.wait_for_event`).
    Events never cross workspaces; with no waiter the event is buffered until its TTL."""

    serializer_class = EventPublishSerializer
    queryset = DurableRun.objects.none()

    @extend_schema(summary="Publish an event", request=EventPublishSerializer,
                   responses={202: EventResultSerializer})
    def create(self, request):
        serializer = self.get_serializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        workspace = data["workspace"]
        self.check_write_role(workspace)
        reached = services.event_publish(name=data["name"], payload=data["payload"], namespace=workspace.namespace)
        return Response({"reached": reached, "buffered": reached == 0}, status=status.HTTP_202_ACCEPTED)

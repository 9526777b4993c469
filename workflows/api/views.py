"""Workflows, their versions and invocations, and the MCP registry, over HTTP, scoped to the caller's
workspaces: another workspace's rows are not in any queryset, so their ids are 404 like missing ones."""

from __future__ import annotations

from django.db import IntegrityError, transaction
from django.db.models import BooleanField, Count, ExpressionWrapper, F, OuterRef, Prefetch, ProtectedError, Q, Subquery
from django_filters.utils import translate_validation
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema, extend_schema_view
from rest_framework import exceptions, status
from rest_framework.decorators import action
from rest_framework.generics import get_object_or_404
from rest_framework.response import Response

from config.errors import Conflict
from workflows import dsl as dsl_module
from workflows import selectors, services
from workflows.api.filters import (
    McpServerFilter,
    McpToolFilter,
    MessageFilter,
    UserServerConfigFilter,
    VersionActivationFilter,
    WorkflowFilter,
    WorkflowInvocationFilter,
    WorkflowVersionFilter,
)
from workflows.api.serializers import (
    DecisionSerializer,
    InvocationCancelSerializer,
    InvocationMessageSerializer,
    InvokeSerializer,
    McpServerSerializer,
    McpToolSerializer,
    UserServerConfigSerializer,
    VersionActivationSerializer,
    VersionDiffSerializer,
    WorkflowImportSerializer,
    WorkflowInvocationDetailSerializer,
    WorkflowInvocationSerializer,
    WorkflowSerializer,
    WorkflowVersionCreateSerializer,
    WorkflowVersionDetailSerializer,
    WorkflowVersionSerializer,
    WorkflowVersionWrittenSerializer,
)
from workflows.models import (
    McpServer,
    McpServerVersion,
    McpTool,
    Message,
    NodeInvocation,
    NodeVersion,
    UserServerConfig,
    VersionActivation,
    Workflow,
    WorkflowInvocation,
    WorkflowVersion,
)
from workspaces.api.base import WorkspaceScopedReadOnlyViewSet, WorkspaceScopedViewSet
from workspaces.api.pagination import IdCursorPagination

IMPORT_NAME_MAX = Workflow._meta.get_field("name").max_length


MESSAGE_PARAMETERS = [
    OpenApiParameter("node_seq", OpenApiTypes.INT, description="Messages of the node invocation with this seq."),
    OpenApiParameter("role", OpenApiTypes.STR, many=True, enum=Message.Role.values,
                     description="Messages with this role; repeat for several."),
    OpenApiParameter("from_node", OpenApiTypes.STR, description="Sent by this node id."),
    OpenApiParameter("to_node", OpenApiTypes.STR, description="Sent to this node id."),
]


class SeqCursorPagination(IdCursorPagination):
    ordering = ("seq",)  # unique per invocation; the (invocation, seq) unique index serves it


def _dsl_invalid(exc: dsl_module.DslError) -> exceptions.ValidationError:
    """A DslError as a 400: its paths (`nodes[planner].handOffs`) under `dsl`, `parents` on its own."""
    errors: dict = {}
    paths: dict[str, list[str]] = {}
    for path, messages in exc.errors.items():
        if path in ("dsl", "parents"):
            errors[path] = messages
        else:
            paths[path] = messages
    if paths:
        errors["dsl"] = paths if "dsl" not in errors else {"": errors["dsl"], **paths}
    return exceptions.ValidationError(errors)


def version_queryset(*, dsl: bool = True, nodes: bool = False):
    queryset = WorkflowVersion.objects.select_related("workflow", "created_by")
    if nodes:
        queryset = queryset.prefetch_related(Prefetch("nodes", queryset=NodeVersion.objects.order_by("id")))
    return queryset if dsl else queryset.defer("dsl", "input_schema", "output_schema")


def invocation_queryset(*, detail: bool):
    # the workflow's id through one join, never the version row (its DSL) per invocation
    queryset = WorkflowInvocation.objects.select_related("created_by").annotate(
        workflow_pk=F("workflow_version__workflow_id"))
    if detail:
        return queryset.prefetch_related(
            Prefetch("node_invocations", queryset=NodeInvocation.objects.order_by("seq")))
    return queryset.defer("input", "output")


# --------------------------------------------------------------------------------------- workflows

@extend_schema_view(
    create=extend_schema(summary="Create a workflow in one of your workspaces"),
    update=extend_schema(summary="Rename a workflow or change its description"),
    partial_update=extend_schema(summary="Rename a workflow or change its description"),
    destroy=extend_schema(summary="Delete a workflow and its versions (409 once it has invocations)"),
)
class WorkflowViewSet(WorkspaceScopedViewSet):
    """Workflows of the caller's workspaces. POST a DSL to versions/ to add a version; import/ takes a DSL
    or an exported file and creates the workflow when needed."""

    queryset = Workflow.objects.select_related("owner").annotate(
        active_version=Subquery(WorkflowVersion.objects.filter(
            workflow=OuterRef("pk"), status=WorkflowVersion.Status.ACTIVE).values("pk")[:1]),
        version_count=Count("versions"),
    )
    serializer_class = WorkflowSerializer
    filterset_class = WorkflowFilter

    def get_serializer_class(self):
        return {"versions": WorkflowVersionCreateSerializer,
                "import_version": WorkflowImportSerializer}.get(self.action, WorkflowSerializer)

    def perform_create(self, serializer):
        data = serializer.validated_data
        self.check_write_role(data["workspace"])
        workflow = services.workflow_create(workspace=data["workspace"], name=data["name"],
                                            description=data.get("description", ""), owner=self.request.user)
        serializer.instance = self.get_queryset().get(pk=workflow.pk)

    def perform_destroy(self, instance):
        try:
            with transaction.atomic():
                instance.delete()
        except ProtectedError:
            raise Conflict(f"Workflow {instance.pk} has invocations; their history keeps its versions, so it "
                           "cannot be deleted.") from None

    def _written(self, version: WorkflowVersion, created: bool) -> Response:
        version = version_queryset(nodes=True).get(pk=version.pk)
        version.created = created
        body = WorkflowVersionWrittenSerializer(version, context=self.get_serializer_context()).data
        return Response(body, status=status.HTTP_201_CREATED if created else status.HTTP_200_OK)

    @extend_schema(summary="Add a version to the workflow from a DSL (the same DSL again returns its version, 200)",
                   request=WorkflowVersionCreateSerializer,
                   responses={201: WorkflowVersionWrittenSerializer, 200: WorkflowVersionWrittenSerializer})
    @action(detail=True, methods=["post"])
    def versions(self, request, pk=None):
        workflow = self.get_object()  # a write: the object permission checks the caller's role
        serializer = WorkflowVersionCreateSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        ids = list(dict.fromkeys(data["parents"]))
        found = {version.pk: version for version in WorkflowVersion.objects.filter(workflow=workflow, pk__in=ids)}
        unknown = [str(pk) for pk in ids if pk not in found]
        if unknown:
            raise exceptions.ValidationError({"parents": [f"Not versions of this workflow: {', '.join(unknown)}."]})
        operation = data.get("operation") or (
            WorkflowVersion.Operation.MANUAL if WorkflowVersion.objects.filter(workflow=workflow).exists()
            else WorkflowVersion.Operation.INIT)
        try:
            version, created = services.workflow_version_create(
                workflow=workflow, dsl=data["dsl"], operation=operation, parents=tuple(found[pk] for pk in ids),
                commit_message=data["commit_message"], created_by=request.user)
        except dsl_module.DslError as exc:
            raise _dsl_invalid(exc) from None
        return self._written(version, created)

    @extend_schema(summary="Import a DSL or an exported version into a workspace (as `manage.py workflow import`)",
                   request=WorkflowImportSerializer,
                   responses={201: WorkflowVersionWrittenSerializer, 200: WorkflowVersionWrittenSerializer})
    @action(detail=False, methods=["post"], url_path="import", url_name="import")
    def import_version(self, request):
        """The workflow is found by name in the workspace or created; the same DSL imported twice is one
        version (200). Tools this installation lacks are kept as `unresolved_tools`."""
        serializer = WorkflowImportSerializer(data=request.data, context=self.get_serializer_context())
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        workspace = data["workspace"]
        self.check_write_role(workspace)
        try:
            parsed = dsl_module.parse(data["dsl"])
            name = data.get("workflow") or _import_name(parsed)
            with transaction.atomic():
                workflow = Workflow.objects.filter(workspace=workspace, name=name).first()
                if workflow is None:
                    workflow = _workflow_get_or_create(workspace=workspace, name=name, owner=request.user)
                version, created = services.workflow_version_create(
                    workflow=workflow, dsl=data["dsl"], created_by=request.user,
                    commit_message=data["commit_message"] or "imported through the API")
        except dsl_module.DslError as exc:
            raise _dsl_invalid(exc) from None
        return self._written(version, created)


def _import_name(parsed: dict) -> str:
    """An imported document's workflow: its own `name` when it has one, else one derived from its hash,
    so importing the same document again finds the same workflow (and version)."""
    name = parsed.get("name")
    if isinstance(name, str) and name.strip() and len(name) <= IMPORT_NAME_MAX:
        return name.strip()
    return f"imported-{dsl_module.dsl_hash(parsed)[:12]}"


def _workflow_get_or_create(*, workspace, name: str, owner) -> Workflow:
    try:
        with transaction.atomic():
            return services.workflow_create(workspace=workspace, name=name, owner=owner)
    except IntegrityError:  # created at the same moment by another import
        return Workflow.objects.get(workspace=workspace, name=name)


# ---------------------------------------------------------------------------------------- versions

@extend_schema_view(
    list=extend_schema(summary="List versions", description="Without their DSL; the detail has it and the nodes."),
    retrieve=extend_schema(summary="A version: DSL, nodes, genealogy and scores"),
)
class WorkflowVersionViewSet(WorkspaceScopedReadOnlyViewSet):
    """Versions of the caller's workflows. A version is immutable: only its status (activate) and scores
    change. `?parent=<id>` lists a version's children."""

    queryset = WorkflowVersion.objects.all()
    serializer_class = WorkflowVersionSerializer
    filterset_class = WorkflowVersionFilter
    workspace_field = "workflow__workspace"

    def get_queryset(self):
        # the list leaves the DSL out; only the detail (and activate, which answers it) reads the nodes
        self.queryset = version_queryset(dsl=self.action != "list", nodes=self.action in ("retrieve", "activate"))
        return super().get_queryset()

    def get_serializer_class(self):
        return {"retrieve": WorkflowVersionDetailSerializer, "activate": WorkflowVersionDetailSerializer,
                "invoke": InvokeSerializer}.get(self.action, WorkflowVersionSerializer)

    def workspace_of(self, obj):
        return obj.workflow.workspace_id

    @extend_schema(summary="The version's DSL, as `manage.py workflow export` prints it",
                   responses={200: OpenApiTypes.OBJECT})
    @action(detail=True, methods=["get"])
    def export(self, request, pk=None):
        return Response(self.get_object().dsl)

    @extend_schema(summary="What changed from another version to this one: per node, and the DSL as a diff",
                   parameters=[OpenApiParameter("against", OpenApiTypes.INT, required=True,
                                                description="The version to compare against (one of yours).")],
                   responses=VersionDiffSerializer)
    @action(detail=True, methods=["get"])
    def diff(self, request, pk=None):
        version = self.get_object()
        raw = request.query_params.get("against", "")
        if not (raw.isascii() and raw.isdigit() and len(raw) <= 10):
            raise exceptions.ValidationError({"against": ["A version id is required."]})
        other = version_queryset().filter(
            pk=int(raw), pk__in=self.get_queryset().values("pk")).first()
        if other is None:
            raise exceptions.ValidationError({"against": [f"No version {raw} in your workspaces."]})
        return Response(VersionDiffSerializer(selectors.version_diff(other, version)).data)

    @extend_schema(summary="Make this the workflow's active version (the one active before is archived)",
                   request=None, responses=WorkflowVersionDetailSerializer)
    @action(detail=True, methods=["post"])
    def activate(self, request, pk=None):
        version = services.workflow_version_activate(version=self.get_object(), user=request.user)
        version = self.get_queryset().get(pk=version.pk)
        return Response(WorkflowVersionDetailSerializer(version, context=self.get_serializer_context()).data)

    @extend_schema(summary="Start an invocation of this version on an input (202; it runs in the background)",
                   request=InvokeSerializer, responses={202: WorkflowInvocationDetailSerializer})
    @action(detail=True, methods=["post"])
    def invoke(self, request, pk=None):
        """Refused (400) when the input does not match the version's `inputSchema` (`input` lists each problem
        with its place in the input), or when the version names tools or models this installation lacks: `tools`
        and `models` list each one with its node."""
        version = self.get_object()
        serializer = InvokeSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        invocation = services.invocation_start(version=version, input=data["input"], user=request.user,
                                               node_budget=data.get("node_budget"), usd_budget=data.get("usd_budget"))
        invocation = invocation_queryset(detail=True).get(pk=invocation.pk)
        return Response(WorkflowInvocationDetailSerializer(invocation, context=self.get_serializer_context()).data,
                        status=status.HTTP_202_ACCEPTED)


@extend_schema_view(list=extend_schema(summary="The activation history of your workflows, newest first"),
                   retrieve=extend_schema(summary="An activation"))
class VersionActivationViewSet(WorkspaceScopedReadOnlyViewSet):
    """Every activation of a version (activate, promote) and every rollback, newest first. A rollback
    re-activates the version of the newest activation's `parent`. `?workflow=<id>` is one workflow's history."""

    queryset = VersionActivation.objects.select_related("workflow", "created_by")
    serializer_class = VersionActivationSerializer
    filterset_class = VersionActivationFilter
    workspace_field = "workflow__workspace"


# ------------------------------------------------------------------------------------- invocations

@extend_schema_view(
    list=extend_schema(summary="List invocations", description="Newest first, without input, output or nodes."),
    retrieve=extend_schema(summary="An invocation with its input, output and node invocations in seq order"),
)
class WorkflowInvocationViewSet(WorkspaceScopedReadOnlyViewSet):
    """Invocations of the caller's workflow versions. Each is driven by a durable run (`durable_run`);
    messages/ pages through what its nodes said, in order."""

    queryset = WorkflowInvocation.objects.all()
    serializer_class = WorkflowInvocationSerializer
    filterset_class = WorkflowInvocationFilter

    def get_queryset(self):
        self.queryset = invocation_queryset(detail=self.action != "list")
        return super().get_queryset()

    def get_serializer_class(self):
        return {"retrieve": WorkflowInvocationDetailSerializer, "approve": DecisionSerializer,
                "reject": DecisionSerializer, "revise": DecisionSerializer, "cancel": InvocationCancelSerializer,
                "messages": InvocationMessageSerializer}.get(self.action, WorkflowInvocationSerializer)

    def _detail(self, invocation: WorkflowInvocation, code: int = status.HTTP_200_OK) -> Response:
        invocation = self.get_queryset().get(pk=invocation.pk)
        return Response(WorkflowInvocationDetailSerializer(invocation, context=self.get_serializer_context()).data,
                        status=code)

    @extend_schema(summary="The invocation's messages in seq order (cursor pages)",
                   parameters=MESSAGE_PARAMETERS, responses=InvocationMessageSerializer(many=True))
    @action(detail=True, methods=["get"], pagination_class=SeqCursorPagination, filter_backends=[])
    def messages(self, request, pk=None):
        # the invocation without the list's filters: the query parameters here filter its messages
        invocation = get_object_or_404(self.get_queryset().select_related(None).prefetch_related(None)
                                       .only("pk", "workspace_id"), pk=pk)
        self.check_object_permissions(request, invocation)
        queryset = Message.objects.filter(workflow_invocation=invocation).annotate(node_seq=F("node_invocation__seq"))
        filterset = MessageFilter(request.query_params, queryset=queryset, request=request)
        if not filterset.is_valid():
            raise translate_validation(filterset.errors)
        page = self.paginate_queryset(filterset.qs)
        return self.get_paginated_response(InvocationMessageSerializer(page, many=True).data)

    def _decide(self, request, decision: str) -> Response:
        invocation = self.get_object()
        serializer = DecisionSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        services.invocation_decide(invocation=invocation, decision=decision, user=request.user,
                                   comment=serializer.validated_data["comment"],
                                   node_seq=serializer.validated_data.get("node_seq"))
        return self._detail(invocation)

    @extend_schema(summary="Approve the node waiting for approval (409 when none is waiting)",
                   request=DecisionSerializer, responses=WorkflowInvocationDetailSerializer)
    @action(detail=True, methods=["post"])
    def approve(self, request, pk=None):
        return self._decide(request, "approve")

    @extend_schema(summary="Reject the node waiting for approval; the invocation fails with the comment "
                           "(409 when none is waiting)",
                   request=DecisionSerializer, responses=WorkflowInvocationDetailSerializer)
    @action(detail=True, methods=["post"])
    def reject(self, request, pk=None):
        return self._decide(request, "reject")

    @extend_schema(summary="Ask the model to revise the waiting node's answer: the comment (required) is its "
                           "feedback; the node answers again and waits for another decision (409 when none is "
                           "waiting)",
                   request=DecisionSerializer, responses=WorkflowInvocationDetailSerializer)
    @action(detail=True, methods=["post"])
    def revise(self, request, pk=None):
        return self._decide(request, "revise")

    @extend_schema(summary="Cancel a queued, running or waiting invocation (409 once it has ended)",
                   request=InvocationCancelSerializer, responses=WorkflowInvocationDetailSerializer)
    @action(detail=True, methods=["post"])
    def cancel(self, request, pk=None):
        invocation = self.get_object()
        serializer = InvocationCancelSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        if not services.invocation_cancel(invocation=invocation, reason=serializer.validated_data["reason"]):
            current = WorkflowInvocation.objects.filter(pk=invocation.pk).values_list("status", flat=True).first()
            raise Conflict(f"Invocation {invocation.pk} is {current}; only queued, running or waiting invocations "
                           "can be cancelled.")
        return self._detail(invocation)


# ------------------------------------------------------------------------------------ MCP registry

class McpServerViewSet(WorkspaceScopedReadOnlyViewSet):
    """MCP servers registered in the caller's workspaces, each with its active version and its tools
    (`manage.py mcp_sync` refreshes them)."""

    queryset = McpServer.objects.prefetch_related(Prefetch(
        "versions", to_attr="active_versions",
        queryset=McpServerVersion.objects.filter(status=McpServerVersion.Status.ACTIVE).prefetch_related(
            Prefetch("tools", queryset=McpTool.objects.order_by("name")))))
    serializer_class = McpServerSerializer
    filterset_class = McpServerFilter


class McpToolViewSet(WorkspaceScopedReadOnlyViewSet):
    """Tools of the MCP servers of the caller's workspaces (`?active=true`: those nodes can use now)."""

    queryset = McpTool.objects.select_related("server_version__server")
    serializer_class = McpToolSerializer
    filterset_class = McpToolFilter
    workspace_field = "server_version__server__workspace"


class UserServerConfigViewSet(WorkspaceScopedReadOnlyViewSet):
    """The caller's own settings for MCP servers of their workspaces. Secrets are never read here:
    `has_secrets` says whether any are saved."""

    queryset = UserServerConfig.objects.select_related("server").defer("secrets").annotate(
        has_secrets=ExpressionWrapper(~Q(secrets=""), output_field=BooleanField()))
    serializer_class = UserServerConfigSerializer
    filterset_class = UserServerConfigFilter
    workspace_field = "server__workspace"

    def get_queryset(self):
        return super().get_queryset().filter(user=self.request.user)

"""Query parameters of the workflow lists. A row chosen by id (a workflow, a version) must be one of the
caller's workspaces: another workspace's id is "not a valid choice", exactly like a missing one."""

import django_filters
from django import forms
from django.db.models import Q
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema_field

from workflows.models import (
    InvocationStatus,
    McpServer,
    McpServerVersion,
    McpTool,
    Message,
    UserServerConfig,
    VersionActivation,
    Workflow,
    WorkflowInvocation,
    WorkflowVersion,
)
from workspaces.api.base import member_workspace_ids
from workspaces.api.filters import WorkspaceFilter

MAX_INT = 2**31 - 1


def _scoped(model, workspace_field: str):
    """Choices of a filter: rows of `model` in the caller's workspaces (validated by one `get`, never listed:
    the widget is a number box, so the browsable API's filter form renders no select of every row)."""

    def queryset(request):
        if request is None:
            return model.objects.none()
        return model.objects.filter(**{f"{workspace_field}__in": member_workspace_ids(request.user)})

    return queryset


@extend_schema_field(OpenApiTypes.INT)
class ScopedChoiceFilter(django_filters.ModelChoiceFilter):
    def __init__(self, *args, model, workspace_field: str, **kwargs):
        kwargs.setdefault("queryset", _scoped(model, workspace_field))
        kwargs.setdefault("widget", forms.NumberInput)
        super().__init__(*args, **kwargs)


@extend_schema_field(OpenApiTypes.INT)
class BoundedIntegerFilter(django_filters.NumberFilter):
    """A whole number within the column's range (NumberFilter takes decimals and any magnitude)."""

    field_class = forms.IntegerField

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("min_value", 0)
        kwargs.setdefault("max_value", MAX_INT)
        super().__init__(*args, **kwargs)


def _workflow_filter(field_name: str, **kwargs):
    return ScopedChoiceFilter(field_name=field_name, model=Workflow, workspace_field="workspace", **kwargs)


def _version_filter(field_name: str, **kwargs):
    return ScopedChoiceFilter(field_name=field_name, model=WorkflowVersion, workspace_field="workflow__workspace",
                              **kwargs)


class WorkflowFilter(django_filters.FilterSet):
    workspace = WorkspaceFilter()
    q = django_filters.CharFilter(method="filter_q", help_text="Words in the name.")

    class Meta:
        model = Workflow
        fields = ["workspace"]

    def filter_q(self, queryset, name, value):
        return queryset.filter(name__icontains=value)


class WorkflowVersionFilter(django_filters.FilterSet):
    workspace = WorkspaceFilter(field_name="workflow__workspace")
    workflow = _workflow_filter("workflow", help_text="Versions of this workflow (one of yours).")
    parent = _version_filter("parent1", method="filter_parent",
                             help_text="Children of this version: versions bred or edited from it (either parent).")
    generation = BoundedIntegerFilter(help_text="Versions bred in this generation of an evolution run.")

    class Meta:
        model = WorkflowVersion
        fields = ["workspace", "workflow", "status", "operation", "generation"]

    def filter_parent(self, queryset, name, value):
        return queryset.filter(Q(parent1=value) | Q(parent2=value)) if value is not None else queryset


class VersionActivationFilter(django_filters.FilterSet):
    workspace = WorkspaceFilter(field_name="workflow__workspace")
    workflow = _workflow_filter("workflow", help_text="The activation history of this workflow (one of yours).")
    version = _version_filter("workflow_version", help_text="Activations of this version.")

    class Meta:
        model = VersionActivation
        fields = ["workspace", "workflow", "version", "kind"]


class WorkflowInvocationFilter(django_filters.FilterSet):
    workspace = WorkspaceFilter()
    workflow = _workflow_filter("workflow_version__workflow", help_text="Invocations of this workflow's versions.")
    version = _version_filter("workflow_version", help_text="Invocations of this version.")
    status = django_filters.MultipleChoiceFilter(choices=InvocationStatus.choices,
                                                 help_text="Invocation status; repeat for several.")

    class Meta:
        model = WorkflowInvocation
        fields = ["workspace", "workflow", "version", "status"]


class MessageFilter(django_filters.FilterSet):
    node_seq = BoundedIntegerFilter(field_name="node_invocation__seq",
                                    help_text="Messages of the node invocation with this seq.")
    role = django_filters.MultipleChoiceFilter(choices=Message.Role.choices, help_text="Repeat for several.")
    from_node = django_filters.CharFilter(field_name="from_node_id", max_length=200)
    to_node = django_filters.CharFilter(field_name="to_node_id", max_length=200)

    class Meta:
        model = Message
        fields = ["node_seq", "role", "from_node", "to_node"]


class McpServerFilter(django_filters.FilterSet):
    workspace = WorkspaceFilter()
    q = django_filters.CharFilter(method="filter_q", help_text="Words in the slug, name or description.")

    class Meta:
        model = McpServer
        fields = ["workspace", "slug"]

    def filter_q(self, queryset, name, value):
        return queryset.filter(Q(slug__icontains=value) | Q(display_name__icontains=value)
                               | Q(description__icontains=value))


class McpToolFilter(django_filters.FilterSet):
    workspace = WorkspaceFilter(field_name="server_version__server__workspace")
    server = ScopedChoiceFilter(field_name="server_version__server", model=McpServer, workspace_field="workspace",
                                help_text="Tools of this server (one of yours).")
    active = django_filters.BooleanFilter(method="filter_active",
                                          help_text="Only tools of servers' active versions (true) or of superseded "
                                                    "ones (false).")
    q = django_filters.CharFilter(field_name="name", lookup_expr="icontains", help_text="Words in the name.")

    class Meta:
        model = McpTool
        fields = ["workspace", "server", "active"]

    def filter_active(self, queryset, name, value):
        active = Q(server_version__status=McpServerVersion.Status.ACTIVE)
        return queryset.filter(active) if value else queryset.exclude(active)


class UserServerConfigFilter(django_filters.FilterSet):
    workspace = WorkspaceFilter(field_name="server__workspace")
    server = ScopedChoiceFilter(field_name="server", model=McpServer, workspace_field="workspace")

    class Meta:
        model = UserServerConfig
        fields = ["workspace", "server", "enabled"]

"""The workspace-scoped base every API viewset inherits first.

It owns authentication, permissions and the workspace filter, so a view cannot forget
them: a row of a workspace the caller does not belong to is simply not in the queryset,
which makes it a 404 (never a 403 that would confirm it exists, never a 200).
"""

from __future__ import annotations

from functools import cached_property

from django.db.models import CharField, QuerySet, Value
from django.db.models.functions import Cast, Concat
from rest_framework import mixins, permissions, serializers, viewsets
from rest_framework.exceptions import NotFound, PermissionDenied, ValidationError
from rest_framework.request import Request

from workspaces.api.parsers import NUL, NUL_MESSAGE, nul_parameter
from workspaces.models import Membership, Workspace


def member_workspace_ids(user) -> QuerySet:
    """Subquery of the ids of the user's workspaces (one SQL subquery, never a Python list)."""
    return Membership.objects.filter(user=user).values("workspace_id")


def member_namespaces(user, *, roles=None) -> QuerySet:
    """Subquery of the durable namespaces of the user's workspaces (`Workspace.namespace`, "ws-<pk>", in
    SQL), optionally only those where the user holds one of `roles`."""
    memberships = Membership.objects.filter(user=user)
    if roles is not None:
        memberships = memberships.filter(role__in=roles)
    return memberships.annotate(
        ns=Concat(Value("ws-"), Cast("workspace_id", CharField()), output_field=CharField())
    ).values("ns")


class WorkspaceRolePermission(permissions.BasePermission):
    """Reads need membership (enforced by the queryset); writes need a role in `view.write_roles`."""

    message = "Your role in this workspace does not allow this change."

    def has_object_permission(self, request, view, obj):
        if request.method in permissions.SAFE_METHODS:
            return True
        if not isinstance(obj, view.get_queryset().model):
            # not a row of this view: the browsable API asks about a view's answer (a search result) to
            # decide whether to draw a write form; nothing names a workspace, so no write is allowed on it
            return False
        workspace = view.workspace_of(obj)
        return view.user_role(workspace) in view.write_roles


class WorkspaceScopedMixin:
    """Inherit first. Set `workspace_field` to the lookup path from the model to its Workspace
    ("workspace" by default, "" for the Workspace model itself) and, for writes,
    `write_roles` to the roles allowed to change rows (any member by default)."""

    request: Request  # the viewset's, which this is mixed into
    permission_classes = [permissions.IsAuthenticated, WorkspaceRolePermission]
    workspace_field: str = "workspace"
    write_roles: frozenset[str] = frozenset(Membership.Role.values)

    def initial(self, request, *args, **kwargs):
        super().initial(request, *args, **kwargs)
        # Postgres cannot compare or store NUL: refuse it before any filter or lookup sees it
        if any(NUL in str(value) for value in kwargs.values()):
            raise NotFound()
        name = nul_parameter(request.query_params)
        if name is not None:
            raise ValidationError({name: [NUL_MESSAGE]})

    def get_queryset(self):
        queryset = super().get_queryset()
        ids = member_workspace_ids(self.request.user)
        if self.workspace_field == "":
            return queryset.filter(pk__in=ids)
        return queryset.filter(**{f"{self.workspace_field}__in": ids})

    @cached_property
    def _roles(self) -> dict[int, str]:
        return dict(Membership.objects.filter(user=self.request.user).values_list("workspace_id", "role"))

    def user_role(self, workspace: Workspace | int | None) -> str | None:
        workspace_id = getattr(workspace, "pk", workspace)
        return self._roles.get(workspace_id)

    def workspace_of(self, obj) -> Workspace:
        if self.workspace_field == "":
            return obj
        for part in self.workspace_field.split("__"):
            obj = getattr(obj, part)
        return obj

    def check_write_role(self, workspace: Workspace | int | None) -> None:
        if self.user_role(workspace) not in self.write_roles:
            raise PermissionDenied("Your role in this workspace does not allow this change.")

    def perform_create(self, serializer):
        workspace = serializer.validated_data.get("workspace")
        if workspace is not None:
            self.check_write_role(workspace)
        serializer.save()


class WorkspaceScopedViewSet(WorkspaceScopedMixin, viewsets.ModelViewSet):
    pass


class WorkspaceScopedReadOnlyViewSet(WorkspaceScopedMixin, viewsets.ReadOnlyModelViewSet):
    pass


class WorkspaceScopedCreateReadViewSet(WorkspaceScopedMixin, mixins.CreateModelMixin, viewsets.ReadOnlyModelViewSet):
    pass


class WorkspaceField(serializers.PrimaryKeyRelatedField):
    """A workspace chosen by id among the caller's workspaces only; any other id is
    'does not exist', so a serializer can never attach a row to a foreign workspace."""

    def __init__(self, **kwargs):
        kwargs.setdefault("queryset", Workspace.objects.all())
        super().__init__(**kwargs)

    def get_queryset(self):
        request = self.context.get("request")
        if request is None:
            return Workspace.objects.none()
        return Workspace.objects.filter(pk__in=member_workspace_ids(request.user))

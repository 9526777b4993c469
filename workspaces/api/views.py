from django.db import transaction
from rest_framework.exceptions import PermissionDenied, ValidationError

from workspaces import services
from workspaces.api.base import WorkspaceScopedViewSet
from workspaces.api.filters import MembershipFilter
from workspaces.api.serializers import MembershipSerializer, WorkspaceSerializer
from workspaces.models import Membership, Workspace


class WorkspaceViewSet(WorkspaceScopedViewSet):
    """Workspaces the caller belongs to. Anyone signed in may create one and becomes its owner;
    owners and admins may rename it; only an owner may delete it."""

    queryset = Workspace.objects.all()
    serializer_class = WorkspaceSerializer
    workspace_field = ""
    write_roles = Membership.Role.MANAGERS

    def perform_create(self, serializer):
        data = serializer.validated_data
        serializer.instance = services.workspace_create(
            name=data["name"], slug=data.get("slug", ""), owner=self.request.user
        )
        self.__dict__.pop("_roles", None)  # the caller just became an owner

    def perform_destroy(self, instance):
        if self.user_role(instance) != Membership.Role.OWNER:
            raise PermissionDenied("Only an owner may delete a workspace.")
        instance.delete()


class MembershipViewSet(WorkspaceScopedViewSet):
    """Members of the caller's workspaces. Owners and admins add, change and remove members;
    the last owner of a workspace cannot be removed or demoted."""

    queryset = Membership.objects.select_related("user", "workspace")
    serializer_class = MembershipSerializer
    filterset_class = MembershipFilter
    write_roles = Membership.Role.MANAGERS

    def _guard_last_owner(self, membership: Membership, new_role: str | None) -> None:
        if membership.role != Membership.Role.OWNER or new_role == Membership.Role.OWNER:
            return
        owners = Membership.objects.select_for_update().filter(
            workspace=membership.workspace, role=Membership.Role.OWNER
        )
        if owners.count() <= 1:
            raise ValidationError({"role": ["A workspace must keep at least one owner."]})

    def perform_create(self, serializer):
        workspace = serializer.validated_data["workspace"]
        self.check_write_role(workspace)
        if (serializer.validated_data.get("role") == Membership.Role.OWNER
                and self.user_role(workspace) != Membership.Role.OWNER):
            raise PermissionDenied("Only an owner may add another owner.")
        serializer.save()

    @transaction.atomic
    def perform_update(self, serializer):
        new_role = serializer.validated_data.get("role", serializer.instance.role)
        if new_role == Membership.Role.OWNER and self.user_role(serializer.instance.workspace) != Membership.Role.OWNER:
            raise PermissionDenied("Only an owner may grant the owner role.")
        self._guard_last_owner(serializer.instance, new_role)
        serializer.save()

    @transaction.atomic
    def perform_destroy(self, instance):
        self._guard_last_owner(instance, None)
        instance.delete()

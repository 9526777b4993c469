"""The admin's workspace scope: a staff user who is not a superuser sees, opens and picks only rows of
the workspaces they are a member of; superusers see everything.

Every ModelAdmin of a workspace-owned model inherits `WorkspaceScopedAdmin` first and says how its
rows reach a workspace: `workspace_field` (a lookup path to the Workspace, "" for Workspace itself) or
`namespace_field` (a lookup path to a durable namespace, "ws-<workspace id>"). The changelist, its
filters and facet counts, the change and delete pages (`get_object`), actions, autocomplete and raw-id
lookups all start from `get_queryset`, so a foreign row is simply absent (the change page redirects as
for a missing row); no per-object permission check is needed on top.
"""

from __future__ import annotations

from django.db.models import QuerySet

from workspaces.api.base import member_namespaces, member_workspace_ids
from workspaces.models import Workspace


def sees_everything(request) -> bool:
    return bool(request.user.is_active and request.user.is_superuser)


def workspaces_for(request) -> QuerySet:
    """The workspaces a request's user may see and pick in the admin."""
    if sees_everything(request):
        return Workspace.objects.all()
    return Workspace.objects.for_user(request.user)


class WorkspaceScopedAdmin:
    """Inherit first (before admin.ModelAdmin or ReadOnlyAdmin)."""

    workspace_field: str | None = "workspace"
    namespace_field: str | None = None

    def scope(self, request, queryset: QuerySet) -> QuerySet:
        if sees_everything(request):
            return queryset
        if self.namespace_field:
            return queryset.filter(**{f"{self.namespace_field}__in": member_namespaces(request.user)})
        if self.workspace_field == "":
            return queryset.filter(pk__in=member_workspace_ids(request.user))
        return queryset.filter(**{f"{self.workspace_field}__in": member_workspace_ids(request.user)})

    def get_queryset(self, request):
        return self.scope(request, super().get_queryset(request))

    def formfield_for_foreignkey(self, db_field, request, **kwargs):
        if db_field.related_model is Workspace and "queryset" not in kwargs:
            kwargs["queryset"] = workspaces_for(request)
        elif "queryset" not in kwargs:
            related_admin = self.admin_site._registry.get(db_field.related_model)
            if isinstance(related_admin, WorkspaceScopedAdmin):
                kwargs["queryset"] = related_admin.get_queryset(request)
        return super().formfield_for_foreignkey(db_field, request, **kwargs)

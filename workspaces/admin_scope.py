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

from django.contrib import admin
from django.core.exceptions import ValidationError
from django.db.models import Count, Q, QuerySet

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
            # the namespaces as a list (one small query a request): Postgres then reads them through a
            # namespace index, where the subquery of computed names ("ws-" || id) only joins by hash
            namespaces = per_request(request, "namespaces",
                                     lambda: list(member_namespaces(request.user).values_list("ns", flat=True)))
            return queryset.filter(**{f"{self.namespace_field}__in": namespaces})
        if self.workspace_field == "":
            return queryset.filter(pk__in=member_workspace_ids(request.user))
        return queryset.filter(**{f"{self.workspace_field}__in": member_workspace_ids(request.user)})

    def render_change_form(self, request, context, add=False, change=False, form_url="", obj=None):
        from workspaces.api.routers import api_link

        if obj is not None:  # the same row in the browsable API ("View in API" on the page)
            context.setdefault("api_url", api_link(type(obj), obj.pk))
        return super().render_change_form(request, context, add, change, form_url, obj)

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


def per_request(request, key: str, compute):
    """A value computed once per request: the changelist builds its filters again for each facet count,
    and a filter's choices would be queried each time."""
    cache = request.__dict__.setdefault("_scoped_admin_cache", {})
    if key not in cache:
        cache[key] = compute()
    return cache[key]


class ScopedChoiceFilter(admin.SimpleListFilter):
    """A list filter on a related row (a workflow, a golden set, a workspace) whose choices are the rows
    of the user's workspaces, read from their own table: no DISTINCT over the listed table, and never
    another workspace's names. Subclasses set `title`, `parameter_name`, `field` (the lookup the
    listed rows are filtered on) and `options(request)` (a queryset of (pk, name) rows)."""

    field: str = ""
    limit = 200

    def options(self, request) -> QuerySet:
        raise NotImplementedError

    def lookups(self, request, model_admin):
        return per_request(request, f"choices:{type(self).__module__}.{type(self).__qualname__}", lambda: [
            (str(pk), name) for pk, name in self.options(request)[:self.limit]])

    def queryset(self, request, queryset):
        value = self.value()
        if not value:
            return queryset
        return queryset.filter(**{self.field: value}) if value.isascii() and value.isdigit() else queryset.none()

    def get_facet_counts(self, pk_attname, filtered_qs):
        return {f"{index}__c": Count(pk_attname, filter=Q(**{self.field: value}))
                for index, (value, _label) in enumerate(self.lookup_choices)}


def full_object(model_admin, request, queryset, object_id):
    """The change page's row, read whole in one query and in the user's scope (the changelist's
    queryset defers the big columns); None for a missing, malformed or foreign id, as the admin expects."""
    try:
        return model_admin.scope(request, queryset).filter(pk=object_id).first()
    except (ValueError, ValidationError):
        return None


class WorkspaceFilter(ScopedChoiceFilter):
    title, parameter_name, field = "workspace", "workspace", "workspace_id"

    def options(self, request):
        return workspaces_for(request).order_by("name").values_list("pk", "name")

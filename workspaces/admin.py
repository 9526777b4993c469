from django.contrib import admin

from .admin_scope import WorkspaceScopedAdmin
from .models import Membership, Workspace


class MembershipInline(admin.TabularInline):
    model = Membership
    extra = 0
    autocomplete_fields = ["user"]


@admin.register(Workspace)
class WorkspaceAdmin(WorkspaceScopedAdmin, admin.ModelAdmin):
    workspace_field = ""

    list_display = ["name", "slug", "member_count", "created_at"]
    search_fields = ["name", "slug"]
    ordering = ["name", "pk"]  # the member count's GROUP BY drops Meta.ordering: pages (autocomplete) stay stable
    prepopulated_fields = {"slug": ["name"]}
    readonly_fields = ["created_at", "updated_at"]
    inlines = [MembershipInline]

    def get_queryset(self, request):
        from django.db.models import Count

        return super().get_queryset(request).annotate(_member_count=Count("memberships"))

    @admin.display(description="members", ordering="_member_count")
    def member_count(self, obj):
        return obj._member_count


@admin.register(Membership)
class MembershipAdmin(WorkspaceScopedAdmin, admin.ModelAdmin):
    list_display = ["user", "workspace", "role", "created_at"]
    list_filter = ["role"]
    list_select_related = ["user", "workspace"]
    search_fields = ["user__username", "user__email", "workspace__name", "workspace__slug"]
    autocomplete_fields = ["user", "workspace"]

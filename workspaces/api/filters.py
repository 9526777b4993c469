import django_filters
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema_field

from workspaces.models import Membership, Workspace


def member_workspaces(request):
    """The choices of a workspace filter: the caller's workspaces only, so the browsable API's filter
    form lists nothing else, and another workspace's id is "not a valid choice" like a missing one."""
    if request is None:
        return Workspace.objects.none()
    return Workspace.objects.for_user(request.user)


@extend_schema_field(OpenApiTypes.INT)
class WorkspaceFilter(django_filters.ModelChoiceFilter):
    def __init__(self, *args, **kwargs):
        kwargs.setdefault("queryset", member_workspaces)
        kwargs.setdefault("help_text", "Only rows of this workspace (one of yours).")
        super().__init__(*args, **kwargs)


class MembershipFilter(django_filters.FilterSet):
    workspace = WorkspaceFilter()

    class Meta:
        model = Membership
        fields = ["workspace", "role"]

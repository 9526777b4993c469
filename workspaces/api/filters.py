import django_filters

from workspaces.models import Membership


class MembershipFilter(django_filters.FilterSet):
    class Meta:
        model = Membership
        fields = ["workspace", "role"]

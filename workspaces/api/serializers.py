from django.contrib.auth import get_user_model
from rest_framework import serializers

from workspaces.api.base import WorkspaceField
from workspaces.models import Membership, Workspace


class WorkspaceSerializer(serializers.ModelSerializer):
    slug = serializers.SlugField(max_length=100, required=False)
    role = serializers.SerializerMethodField(help_text="The caller's role in this workspace.")

    class Meta:
        model = Workspace
        fields = ["id", "name", "slug", "role", "created_at", "updated_at"]
        read_only_fields = ["id", "created_at", "updated_at"]

    def get_role(self, obj) -> str | None:
        view = self.context.get("view")
        return view.user_role(obj) if view is not None and hasattr(view, "user_role") else None

    def validate_slug(self, value):
        queryset = Workspace.objects.filter(slug=value)
        if self.instance is not None:
            queryset = queryset.exclude(pk=self.instance.pk)
        if queryset.exists():
            raise serializers.ValidationError("A workspace with this slug already exists.")
        return value


class MembershipSerializer(serializers.ModelSerializer):
    workspace = WorkspaceField()
    # any active user can be added by username, so the browsable API shows a text box, never a list of
    # every user of the installation
    user = serializers.SlugRelatedField(slug_field="username", queryset=get_user_model().objects.filter(is_active=True),
                                        style={"base_template": "input.html"})

    class Meta:
        model = Membership
        fields = ["id", "workspace", "user", "role", "created_at", "updated_at"]
        read_only_fields = ["id", "created_at", "updated_at"]
        validators = []  # the duplicate check in validate() names the `user` field

    def validate(self, attrs):
        workspace = attrs.get("workspace", getattr(self.instance, "workspace", None))
        user = attrs.get("user", getattr(self.instance, "user", None))
        if self.instance is not None and "workspace" in attrs and attrs["workspace"] != self.instance.workspace:
            raise serializers.ValidationError({"workspace": ["A membership cannot move to another workspace."]})
        if self.instance is not None and "user" in attrs and attrs["user"] != self.instance.user:
            raise serializers.ValidationError({"user": ["A membership cannot change its user."]})
        duplicate = Membership.objects.filter(workspace=workspace, user=user)
        if self.instance is not None:
            duplicate = duplicate.exclude(pk=self.instance.pk)
        if self.instance is None and duplicate.exists():
            raise serializers.ValidationError({"user": ["This user is already a member of the workspace."]})
        return attrs

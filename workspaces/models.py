from django.conf import settings
from django.db import models


class WorkspaceQuerySet(models.QuerySet):
    def for_user(self, user) -> "WorkspaceQuerySet":
        """Workspaces the user is a member of; nothing for an anonymous or inactive user."""
        if not getattr(user, "is_authenticated", False) or not user.is_active:
            return self.none()
        return self.filter(memberships__user=user)


class Workspace(models.Model):
    """The unit of isolation: every row a user owns belongs to exactly one workspace."""

    name = models.CharField(max_length=200)
    slug = models.SlugField(max_length=100, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    objects = WorkspaceQuerySet.as_manager()

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    @property
    def namespace(self) -> str:
        """The durable-run namespace holding this workspace's runs."""
        return self.namespace_of(self.pk)

    @staticmethod
    def namespace_of(workspace_id: int) -> str:
        return f"ws-{workspace_id}"

    @staticmethod
    def id_of_namespace(namespace: str) -> int | None:
        """The workspace id a durable namespace belongs to (None for a namespace of no workspace)."""
        number = namespace[3:] if namespace.startswith("ws-") else ""
        return int(number) if number.isascii() and number.isdigit() else None


class Membership(models.Model):
    class Role(models.TextChoices):
        OWNER = "owner", "Owner"
        ADMIN = "admin", "Admin"
        MEMBER = "member", "Member"

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships")
    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE, related_name="memberships")
    role = models.CharField(max_length=10, choices=Role.choices, default=Role.MEMBER)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["user", "workspace"],
                name="%(app_label)s_%(class)s_one_per_user",
                violation_error_message="This user is already a member of the workspace.",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.user} in {self.workspace} ({self.role})"


# roles allowed to change a workspace and its members (the unique constraint's index serves
# the scoping subquery "workspaces of user X" of every API request)
Membership.Role.MANAGERS = frozenset({Membership.Role.OWNER, Membership.Role.ADMIN})

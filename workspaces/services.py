"""Writes for workspaces and memberships."""

from django.db import transaction
from django.utils.text import slugify

from .models import Membership, Workspace


@transaction.atomic
def workspace_create(*, name: str, owner, slug: str = "") -> Workspace:
    """Create a workspace and make `owner` its owner."""
    workspace = Workspace.objects.create(name=name, slug=slug or slugify(name)[:100])
    Membership.objects.create(workspace=workspace, user=owner, role=Membership.Role.OWNER)
    return workspace


def membership_role(*, user, workspace: Workspace) -> str | None:
    """The user's role in the workspace, or None when not a member."""
    return (
        Membership.objects.filter(user=user, workspace=workspace).values_list("role", flat=True).first()
    )


def membership_can_manage(*, user, workspace: Workspace) -> bool:
    return membership_role(user=user, workspace=workspace) in Membership.Role.MANAGERS

"""Writes for workspaces and memberships."""

from django.db import transaction
from django.utils.text import slugify

from .models import Membership, Workspace


def _free_slug(name: str) -> str:
    """A slug from the name ("workspace" when it has no letter or digit slugify keeps), made unique
    with a counter: "acme", "acme-2", ..."""
    base = slugify(name)[:90] or "workspace"
    taken = set(Workspace.objects.filter(slug__regex=rf"^{base}(-[0-9]+)?$").values_list("slug", flat=True))
    if base not in taken:
        return base
    return next(f"{base}-{n}" for n in range(2, len(taken) + 3) if f"{base}-{n}" not in taken)


@transaction.atomic
def workspace_create(*, name: str, owner, slug: str = "") -> Workspace:
    """Create a workspace and make `owner` its owner (without a slug, one is derived from the name)."""
    workspace = Workspace.objects.create(name=name, slug=slug or _free_slug(name))
    Membership.objects.create(workspace=workspace, user=owner, role=Membership.Role.OWNER)
    return workspace


def membership_role(*, user, workspace: Workspace) -> str | None:
    """The user's role in the workspace, or None when not a member."""
    return (
        Membership.objects.filter(user=user, workspace=workspace).values_list("role", flat=True).first()
    )


def membership_can_manage(*, user, workspace: Workspace) -> bool:
    return membership_role(user=user, workspace=workspace) in Membership.Role.MANAGERS

"""The demo workspace every app's demo seed puts its rows in (`manage.py seed_demo`)."""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.db import transaction

from workspaces.models import Membership, Workspace


def demo_workspace() -> Workspace:
    """The workspace named "demo" (slug "demo"), created when missing; every superuser is made an
    owner of it so the admin login sees it through the API too. Safe to call from any app's seed."""
    with transaction.atomic():
        workspace, _ = Workspace.objects.get_or_create(slug="demo", defaults={"name": "Demo"})
        for user in get_user_model().objects.filter(is_superuser=True, is_active=True):
            Membership.objects.get_or_create(user=user, workspace=workspace,
                                             defaults={"role": Membership.Role.OWNER})
    return workspace


def seed(stdout) -> None:
    demo_workspace()

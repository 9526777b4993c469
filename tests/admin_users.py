"""Staff users and logged-in clients for the admin tests."""

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.test import Client

from tests.factories import MembershipFactory


def admin_staff(username: str, *workspaces, apps, codenames=None):
    """A staff member of `workspaces` with the permissions of `apps` (`codenames` to narrow them)."""
    user = get_user_model().objects.create_user(username, password="x", is_staff=True)
    permissions = Permission.objects.filter(content_type__app_label__in=apps)
    if codenames is not None:
        permissions = permissions.filter(codename__in=codenames)
    user.user_permissions.add(*permissions)
    for workspace in workspaces:
        MembershipFactory(user=user, workspace=workspace)
    return user


def client_of(user) -> Client:
    client = Client()
    client.force_login(user)
    return client

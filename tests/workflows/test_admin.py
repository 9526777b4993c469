"""The workflows admin shows a staff member only their workspaces' workflows, in the list and its filters."""

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.urls import reverse

from tests.factories import MembershipFactory
from workflows.services import workflow_create

pytestmark = pytest.mark.django_db


def test_the_workflow_list_and_its_workspace_filter_show_only_the_users_workspaces(client, workspace,
                                                                                      other_workspace):
    workflow_create(workspace=workspace, name="acme-research")
    workflow_create(workspace=other_workspace, name="globex-research")
    staff = get_user_model().objects.create_user("staff", password="x", is_staff=True)
    staff.user_permissions.add(*Permission.objects.filter(content_type__app_label="workflows"))
    MembershipFactory(user=staff, workspace=other_workspace)
    client.force_login(staff)
    page = client.get(reverse("admin:workflows_workflow_changelist"))
    assert page.status_code == 200
    html = page.content.decode()
    assert "globex-research" in html and "Globex" in html
    assert "acme-research" not in html
    assert workspace.name not in html  # not even as a choice of the workspace filter

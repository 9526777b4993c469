from django.urls import path

from workspaces.api.auth import TokenLoginView, TokenLogoutAllView, TokenLogoutView
from workspaces.api.routers import ApiRouter
from workspaces.api.views import MembershipViewSet, WorkspaceViewSet

router = ApiRouter()
router.register("workspaces", WorkspaceViewSet, basename="workspace")
router.register("memberships", MembershipViewSet, basename="membership")

urlpatterns = [
    path("auth/token/", TokenLoginView.as_view(), name="api-token"),
    path("auth/logout/", TokenLogoutView.as_view(), name="api-logout"),
    path("auth/logout-all/", TokenLogoutAllView.as_view(), name="api-logout-all"),
    *router.urls,
]

from django.urls import re_path

from evals.api.views import (
    EvalRunViewSet,
    GoldenItemViewSet,
    GoldenSetViewSet,
    PromotionViewSet,
    VersionPromoteViewSet,
    WorkflowRollbackViewSet,
)
from workspaces.api.routers import ApiRouter

router = ApiRouter()
router.register("golden-sets", GoldenSetViewSet, basename="golden-set")
router.register("golden-items", GoldenItemViewSet, basename="golden-item")
router.register("eval-runs", EvalRunViewSet, basename="eval-run")
router.register("promotions", PromotionViewSet, basename="promotion")

# Lifecycle actions on the workflows' objects, owned by the evals app: explicit paths under the workflows' URL
# space, with the routers' id pattern. Neither names an action of workflows/api (tests/evals/test_api.py checks).
LOOKUP = r"(?P<pk>[^/.]+)"

urlpatterns = [
    re_path(rf"^workflow-versions/{LOOKUP}/promote/$", VersionPromoteViewSet.as_view({"post": "promote"}),
            name="workflow-version-promote"),
    re_path(rf"^workflows/{LOOKUP}/rollback/$", WorkflowRollbackViewSet.as_view({"post": "rollback"}),
            name="workflow-rollback"),
    *router.urls,
]

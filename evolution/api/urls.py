from django.urls import re_path

from evolution.api.views import EvolutionRunViewSet, VersionLineageViewSet
from workspaces.api.routers import ApiRouter

router = ApiRouter()
router.register("evolution-runs", EvolutionRunViewSet, basename="evolution-run")

# A read on the workflows' objects, owned by the evolution app: an explicit path under the workflows' URL space,
# with the routers' id pattern. It names no action of workflows/api (tests/evolution/test_api.py checks).
LOOKUP = r"(?P<pk>[^/.]+)"

urlpatterns = [
    re_path(rf"^workflow-versions/{LOOKUP}/lineage/$", VersionLineageViewSet.as_view({"get": "lineage"}),
            name="workflow-version-lineage"),
    *router.urls,
]

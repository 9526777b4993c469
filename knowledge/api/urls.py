
from knowledge.api.views import KnowledgeSearchViewSet, KnowledgeSourceViewSet, SkillViewSet
from workspaces.api.routers import ApiRouter

router = ApiRouter()
router.register("knowledge/sources", KnowledgeSourceViewSet, basename="knowledge-source")
router.register("knowledge/search", KnowledgeSearchViewSet, basename="knowledge-search")
router.register("knowledge/skills", SkillViewSet, basename="skill")

urlpatterns = router.urls

from rest_framework.routers import DefaultRouter

from knowledge.api.views import KnowledgeSearchViewSet, KnowledgeSourceViewSet, SkillViewSet

router = DefaultRouter()
router.register("knowledge/sources", KnowledgeSourceViewSet, basename="knowledge-source")
router.register("knowledge/search", KnowledgeSearchViewSet, basename="knowledge-search")
router.register("knowledge/skills", SkillViewSet, basename="skill")

urlpatterns = router.urls

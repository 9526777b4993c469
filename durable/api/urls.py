from rest_framework.routers import DefaultRouter

from durable.api.views import EventViewSet, RunViewSet, ScheduleViewSet

router = DefaultRouter()
router.register("durable/runs", RunViewSet, basename="durable-run")
router.register("durable/schedules", ScheduleViewSet, basename="durable-schedule")
router.register("durable/events", EventViewSet, basename="durable-event")

urlpatterns = router.urls

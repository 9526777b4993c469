
from durable.api.views import EventViewSet, RunViewSet, ScheduleViewSet
from workspaces.api.routers import ApiRouter

router = ApiRouter()
router.register("durable/runs", RunViewSet, basename="durable-run")
router.register("durable/schedules", ScheduleViewSet, basename="durable-schedule")
router.register("durable/events", EventViewSet, basename="durable-event")

urlpatterns = router.urls

from django.contrib import admin
from django.urls import include, path
from django.views.generic import RedirectView
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

from config.views import healthz, healthz_live, healthz_ready, metrics
from workspaces.api.routers import api_root_view

api_patterns = [
    path("", include("workspaces.api.urls")),
    path("", include("durable.api.urls")),
    path("", include("knowledge.api.urls")),
    path("", include("workflows.api.urls")),
    path("", include("evals.api.urls")),
    path("", include("evolution.api.urls")),
]
api_patterns.append(path("", api_root_view(), name="api-root"))  # after the includes: it lists their routers

urlpatterns = [
    path("", RedirectView.as_view(pattern_name="admin:index"), name="home"),
    path("healthz", healthz, name="healthz"),
    path("healthz/live", healthz_live, name="healthz-live"),
    path("healthz/ready", healthz_ready, name="healthz-ready"),
    path("metrics", metrics, name="metrics"),  # 404 unless Prometheus scrapes are configured
    path("admin/", admin.site.urls),
    path("api/", include(api_patterns)),
    path("api/schema/", SpectacularAPIView.as_view(), name="api-schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="api-schema"), name="api-docs"),
]

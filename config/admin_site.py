"""The operator console's admin site: its home (`/admin/`) opens on what needs attention (config/home.py),
and its app list comes below, grouped in the order an operator works with human names.

`LineageAdminSite` is the default site (config.apps.LineageAdminConfig), so every `@admin.register` in the
apps lands on it. Only the index and the navigation sidebar see the groups: an app's own page
(`/admin/<app_label>/`, `get_app_list(request, app_label)`) lists that app as Django builds it.
"""

from __future__ import annotations

import functools

from django.contrib import admin, messages
from django.contrib.admin.utils import unquote
from django.http import HttpResponseBadRequest

from workspaces.api.parsers import NUL, NUL_MESSAGE, nul_parameter

# (group name, the app labels it gathers, its models in the order an operator reaches for them); a model
# not named here follows the named ones alphabetically, an app not named here comes after every group
GROUPS: tuple[tuple[str, tuple[str, ...], tuple[str, ...]], ...] = (
    ("Workflows", ("workflows",), ("workflow", "workflowversion", "workflowinvocation", "nodeinvocation",
                                   "message", "contextentry", "llmcall", "mcpserver", "mcpserverversion",
                                   "userserverconfig")),
    ("Evaluations", ("evals",), ("goldenset", "goldenitem", "evalrun", "goldenresult", "promotion")),
    ("Evolution", ("evolution",), ("evolutionrun", "generation", "individual")),
    ("Knowledge", ("knowledge",), ("knowledgesource", "knowledgechunk", "skill")),
    ("Durable runs", ("durable",), ("durablerun", "schedule", "bufferedsignal", "bufferedevent")),
    ("Access", ("workspaces", "auth", "knox"), ("workspace", "membership", "user", "group", "authtoken")),
)

# model names as an operator says them, where the model's own verbose name is a library's or a table's
MODEL_NAMES = {
    ("knox", "authtoken"): "API tokens",
    ("workflows", "llmcall"): "Model call cache",
    ("workflows", "userserverconfig"): "MCP server configs",
    ("workflows", "mcpserver"): "MCP servers",
    ("workflows", "mcpserverversion"): "MCP server versions",
}


def grouped_app_list(app_dict: dict) -> list[dict]:
    """Django's per-app dictionaries (`AdminSite._build_app_dict`) gathered into GROUPS."""
    groups = []
    for name, labels, order in GROUPS:
        apps_in = [app_dict.pop(label) for label in labels if label in app_dict]
        if not apps_in:
            continue
        models = [model for app in apps_in for model in app["models"]]
        rank = {object_name: index for index, object_name in enumerate(order)}
        models.sort(key=lambda model: (rank.get(model["object_name"].lower(), len(rank)), model["name"]))
        groups.append({**apps_in[0], "name": name, "models": models})
    rest = sorted(app_dict.values(), key=lambda app: app["name"].lower())
    for app in rest:
        app["models"].sort(key=lambda model: model["name"])
    return groups + rest


def nul_part(request, kwargs: dict) -> str | None:
    """The name of the first query parameter or URL part holding a NUL character (an object id also as the admin
    quotes it, "_00"), else None."""
    name = nul_parameter(request.GET)
    if name is not None:
        return name
    return next((key for key, value in kwargs.items() if NUL in str(value) or NUL in unquote(str(value))), None)


class LineageAdminSite(admin.AdminSite):
    site_header = "Lineage"
    site_title = "Lineage"
    index_title = "Operator console"
    index_template = "admin/index.html"

    def admin_view(self, view, cacheable=False):
        """Every admin page (Django's and ours go through here) refuses a NUL character in its query string or
        its URL with a 400 naming the parameter, before any changelist filter, search or lookup reads it."""
        inner = super().admin_view(view, cacheable)

        def refuse_nul(request, *args, **kwargs):
            name = nul_part(request, kwargs)
            if name is not None:
                return HttpResponseBadRequest(f"{name}: {NUL_MESSAGE}",
                                              content_type="text/plain; charset=utf-8")
            return inner(request, *args, **kwargs)

        return functools.update_wrapper(refuse_nul, inner)

    def _build_app_dict(self, request, label=None):
        app_dict = super()._build_app_dict(request, label)
        for app_label, app in app_dict.items():
            for model in app["models"]:
                name = MODEL_NAMES.get((app_label, model["object_name"].lower()))
                if name:
                    model["name"] = name
        return app_dict

    def get_app_list(self, request, app_label=None):
        if app_label is not None:
            return super().get_app_list(request, app_label)
        return grouped_app_list(self._build_app_dict(request))

    def index(self, request, extra_context=None):
        from config import home

        window, error = home.window_from(request.GET.get(home.WINDOW_PARAMETER))
        if error:
            messages.warning(request, error)
        context = {**(extra_context or {}), "home": home.home_page(site=self, request=request, window=window)}
        return super().index(request, extra_context=context)

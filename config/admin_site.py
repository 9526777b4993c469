"""The operator console's admin site: its home (`/admin/`) opens on what needs attention (config/home.py),
and its app list comes below, grouped in the order an operator works with human names.

`LineageAdminSite` is the default site (config.apps.LineageAdminConfig), so every `@admin.register` in the
apps lands on it. Only the index and the navigation sidebar see the groups: an app's own page
(`/admin/<app_label>/`, `get_app_list(request, app_label)`) lists that app as Django builds it.
"""

from __future__ import annotations

from django.contrib import admin, messages

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


class LineageAdminSite(admin.AdminSite):
    site_header = "Lineage"
    site_title = "Lineage"
    index_title = "Operator console"
    index_template = "admin/index.html"

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

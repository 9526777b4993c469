from rest_framework.routers import DefaultRouter

_ROUTERS: list["ApiRouter"] = []


class ApiRouter(DefaultRouter):
    """DefaultRouter without format-suffix URLs (`.../timeline.json`): every view would have to take a
    `format` argument, and one that does not answers a 500. `?format=json` and the Accept header choose
    the format instead. Every app mounts its router at `api/`, so no router draws a root of its own: the one
    root (`api_root_view`) lists the resources of all of them."""

    include_format_suffixes = False
    include_root_view = False

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        _ROUTERS.append(self)


def api_root_view():
    """The view of `/api/`: a link to every resource registered on any ApiRouter, by path. Mount it after the
    apps' URL modules are included (they create the routers)."""
    resources = {}
    for router in _ROUTERS:
        list_name = router.routes[0].name
        for prefix, _viewset, basename in router.registry:
            resources[prefix] = list_name.format(basename=basename)
    return DefaultRouter.APIRootView.as_view(api_root_dict=dict(sorted(resources.items())))


def api_link(model, pk=None) -> str | None:
    """The API's URL of `model`'s list (or, with `pk`, of that row), or None when no resource serves it (the
    admin's change pages link to it). The first resource whose viewset's queryset is of `model` answers."""
    from django.urls import NoReverseMatch, reverse

    for router in _ROUTERS:
        for _prefix, viewset, basename in router.registry:
            queryset = getattr(viewset, "queryset", None)
            if queryset is not None and queryset.model is model:
                try:
                    return reverse(f"{basename}-detail", args=[pk]) if pk is not None else reverse(f"{basename}-list")
                except NoReverseMatch:
                    return None
    return None


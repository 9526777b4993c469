from django.apps import AppConfig
from django.contrib.admin.apps import AdminConfig


class ConfigAppConfig(AppConfig):
    """Hosts the project-wide management commands (locked migrate, admin bootstrap, demo seed)."""

    name = "config"
    label = "lineage_config"
    verbose_name = "Lineage"

    def ready(self):
        from config import checks  # noqa: F401 (registers the start-up checks)
        from config.database import register_fork_safety

        register_fork_safety()


class LineageAdminConfig(AdminConfig):
    """The admin with the operator console's site (its home and grouped app list) as the default site."""

    default_site = "config.admin_site.LineageAdminSite"


class ApiTokensConfig(AppConfig):
    """django-rest-knox under the name an operator knows its tokens by (the label, tables and migrations
    stay knox's)."""

    name = "knox"
    verbose_name = "API tokens"

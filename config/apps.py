from django.apps import AppConfig


class ConfigAppConfig(AppConfig):
    """Hosts the project-wide management commands (locked migrate, admin bootstrap, demo seed)."""

    name = "config"
    label = "lineage_config"
    verbose_name = "Lineage"

    def ready(self):
        from config import checks  # noqa: F401 (registers the start-up checks)
        from config.database import register_fork_safety

        register_fork_safety()

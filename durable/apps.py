from django.apps import AppConfig


class DurableConfig(AppConfig):
    name = "durable"
    verbose_name = "Durable runs"

    def ready(self):
        from durable.registry import autodiscover

        autodiscover()

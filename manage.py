#!/usr/bin/env python
import os
import sys


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    if not os.environ.get("DATABASE_URL") and not os.environ.get("LINEAGE_NO_EMBEDDED"):
        # no database configured: run this command with the embedded services of .data, joining a
        # running `make run` when there is one (see config/services.py)
        from config.services import main as services

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


if __name__ == "__main__":
    main()

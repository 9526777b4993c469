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

    execute_from_command_line(sys.argv)


if __name__ == "__main__":
    main()

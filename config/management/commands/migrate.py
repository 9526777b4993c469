"""`migrate` under a Postgres advisory lock, so containers migrating at once do not race.

The lock is held on a connection of its own, so nothing the migrations do to the
default connection (closing it, failing a transaction) can drop it early.
"""

import zlib

from django.core.management.commands.migrate import Command as DjangoMigrateCommand
from django.db import connections

MIGRATE_LOCK_KEY = zlib.crc32(b"lineage:migrate")


class Command(DjangoMigrateCommand):
    help = DjangoMigrateCommand.help + " Serialised across processes by a Postgres advisory lock."

    def handle(self, *args, **options):
        wrapper = connections[options["database"]]
        if wrapper.vendor != "postgresql":
            return super().handle(*args, **options)
        # straight from the driver, never from the connection pool: a pooled connection closed here would
        # never be given back, and a pool of one would have none left for the migrations
        lock_conn = wrapper.Database.connect(**wrapper.get_connection_params(), autocommit=True)
        try:
            with lock_conn.cursor() as cursor:
                cursor.execute("SELECT pg_try_advisory_lock(%s)", [MIGRATE_LOCK_KEY])
                if not cursor.fetchone()[0]:
                    if options["verbosity"] >= 1:
                        self.stdout.write("Another process is migrating; waiting for it to finish...")
                    cursor.execute("SELECT pg_advisory_lock(%s)", [MIGRATE_LOCK_KEY])
            return super().handle(*args, **options)
        finally:
            lock_conn.close()  # closing the session releases the advisory lock

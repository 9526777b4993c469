from django.db import migrations


class Migration(migrations.Migration):
    """Databases created before the embedded server moved to a portable pgvector build: pg_trgm was
    installed and never used (that server has no pg_trgm), and pgvector's objects move to the library's
    version. Both statements are no-ops on a database created since."""

    dependencies = [("lineage_config", "0001_extensions")]
    operations = [
        migrations.RunSQL("DROP EXTENSION IF EXISTS pg_trgm", reverse_sql=migrations.RunSQL.noop),
        migrations.RunSQL("ALTER EXTENSION vector UPDATE", reverse_sql=migrations.RunSQL.noop),
    ]

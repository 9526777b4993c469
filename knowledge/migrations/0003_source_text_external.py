from django.db import migrations


class Migration(migrations.Migration):
    """Store a text source's text out of line but uncompressed (STORAGE EXTERNAL). Postgres
    compresses large values with pglz by default (this server has no lz4), which made creating a
    500 KB text source take about 14.5 ms and reading it back 2 ms; uncompressed: 2.1 ms and
    1.1 ms. The cost is space: about twice the bytes for the text (its chunks, which hold the
    same text again, are stored uncompressed anyway, see 0002). Existing values keep their
    compression until rewritten."""

    dependencies = [("knowledge", "0002_chunk_storage")]

    operations = [
        migrations.RunSQL(
            "ALTER TABLE knowledge_knowledgesource ALTER COLUMN text SET STORAGE EXTERNAL;",
            "ALTER TABLE knowledge_knowledgesource ALTER COLUMN text SET STORAGE EXTENDED;",
        ),
    ]

from django.db import migrations


class Migration(migrations.Migration):
    """Keep chunk rows (text, a 1.5 KB vector at 384 dimensions, the tsvector) in the heap page
    instead of the TOAST table: Postgres toasts rows past about 2 KB by default, compressing the
    text and tsvector and moving the vector out of line, which costs every insert and every exact
    distance scan a detour. Rows up to 8 KB now stay inline; larger ones are still toasted."""

    dependencies = [("knowledge", "0001_initial")]

    operations = [
        migrations.RunSQL(
            "ALTER TABLE knowledge_knowledgechunk SET (toast_tuple_target = 8160);"
            "ALTER TABLE knowledge_knowledgechunkstage SET (toast_tuple_target = 8160);",
            "ALTER TABLE knowledge_knowledgechunk RESET (toast_tuple_target);"
            "ALTER TABLE knowledge_knowledgechunkstage RESET (toast_tuple_target);",
        ),
    ]

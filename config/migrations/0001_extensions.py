from django.db import migrations
from pgvector.django import VectorExtension


class Migration(migrations.Migration):
    """The Postgres extension the apps rely on: pgvector (knowledge embeddings)."""

    initial = True
    dependencies = []
    operations = [VectorExtension()]

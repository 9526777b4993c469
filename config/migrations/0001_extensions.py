from django.contrib.postgres.operations import TrigramExtension
from django.db import migrations
from pgvector.django import VectorExtension


class Migration(migrations.Migration):
    """The Postgres extensions the apps rely on: pgvector (knowledge embeddings) and pg_trgm
    (fuzzy search in the admin and the API)."""

    initial = True
    dependencies = []
    operations = [VectorExtension(), TrigramExtension()]

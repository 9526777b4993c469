"""Start-up checks of the knowledge base (Django's system checks; `migrate`, which `make run` and the
compose services run first, runs the database ones)."""

from django.conf import settings
from django.core import checks
from django.db import DatabaseError

REEMBED = "python manage.py knowledge reembed"


@checks.register(checks.Tags.database)
def embedding_width_check(app_configs=None, databases=None, **kwargs):
    """Refuse to start on vectors of another width than EMBEDDING_DIMENSIONS: every search would fail
    (or, worse, compare vectors of two models)."""
    if not databases:
        return []
    from knowledge.selectors import embedding_column_width

    try:
        width = embedding_column_width()
    except DatabaseError:  # no database yet: nothing stored to disagree with
        return []
    if width is None or width == settings.EMBEDDING_DIMENSIONS:
        return []
    return [checks.Error(
        f"The stored knowledge vectors are {width}-dimensional but EMBEDDING_DIMENSIONS is "
        f"{settings.EMBEDDING_DIMENSIONS} (EMBEDDING_MODEL {settings.EMBEDDING_MODEL}).",
        hint=f"Run `{REEMBED}` (with `make run` data: make manage ARGS='knowledge reembed') to move the stored "
             f"vectors to the new width and re-embed them with the configured model, or set "
             f"EMBEDDING_DIMENSIONS={width} and the EMBEDDING_MODEL they were made with.",
        id="knowledge.E001")]

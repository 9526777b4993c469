from django.apps import AppConfig
from django.db import transaction
from django.db.models.signals import post_delete


def _drop_workspace_vector_index(sender, instance, **kwargs):
    from knowledge.search import workspace_vector_index_drop

    workspace_id = instance.pk  # Django clears the pk once the delete is done
    # after the commit, outside the transaction: the drop runs CONCURRENTLY and never blocks searches
    transaction.on_commit(lambda: workspace_vector_index_drop(workspace_id))


class KnowledgeConfig(AppConfig):
    name = "knowledge"
    verbose_name = "Knowledge and skills"

    def ready(self):
        from knowledge import checks  # noqa: F401 (registers the start-up checks)

        post_delete.connect(_drop_workspace_vector_index, sender="workspaces.Workspace",
                            dispatch_uid="knowledge_drop_workspace_vector_index")

"""The activation history of workflow versions (``VersionActivation``), which rollbacks follow.

Versions activated before it have no recorded history; the backfill gives each workflow with an
active version the only order there was: its archived versions by when they were last written
(`updated_at`, which finishing an eval run also moved), then its active version. Rollbacks on those
workflows go where they went before this migration for the first steps, and by the recorded history
from the next activation on.
"""

import django.db.models.deletion
import django.utils.timezone
from django.conf import settings
from django.db import migrations, models


def backfill(apps, schema_editor):
    Workflow = apps.get_model("workflows", "Workflow")
    WorkflowVersion = apps.get_model("workflows", "WorkflowVersion")
    VersionActivation = apps.get_model("workflows", "VersionActivation")
    with_active = WorkflowVersion.objects.filter(status="active").values("workflow_id")
    for workflow_id in Workflow.objects.filter(pk__in=with_active).values_list("pk", flat=True).iterator():
        versions = WorkflowVersion.objects.filter(workflow_id=workflow_id, status__in=("archived", "active"))
        chain = sorted(versions.values("pk", "status", "updated_at"),
                       key=lambda row: (row["status"] == "active", row["updated_at"], row["pk"]))
        parent, previous = None, None
        for row in chain:
            parent = VersionActivation.objects.create(
                workflow_id=workflow_id, workflow_version_id=row["pk"], previous_version_id=previous, parent=parent,
                kind="activate", created_at=row["updated_at"])
            previous = row["pk"]


class Migration(migrations.Migration):

    dependencies = [
        ('workflows', '0004_dsl_hash_keeps_handoff_order'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.CreateModel(
            name='VersionActivation',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('kind', models.CharField(choices=[('activate', 'Activation'), ('rollback', 'Rollback')], default='activate', max_length=10)),
                ('created_at', models.DateTimeField(default=django.utils.timezone.now)),
                ('created_by', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to=settings.AUTH_USER_MODEL)),
                ('parent', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to='workflows.versionactivation')),
                ('previous_version', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to='workflows.workflowversion')),
                ('workflow', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='activations', to='workflows.workflow')),
                ('workflow_version', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='activations', to='workflows.workflowversion')),
            ],
            options={
                'ordering': ['-id'],
                'indexes': [models.Index(fields=['workflow', '-id'], name='workflows_activation_wf_idx')],
            },
        ),
        migrations.RunPython(backfill, migrations.RunPython.noop),
    ]

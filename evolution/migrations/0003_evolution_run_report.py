from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('evolution', '0002_evolution_run_active_index'),
    ]

    operations = [
        migrations.AddField(
            model_name='evolutionrun',
            name='report',
            field=models.JSONField(blank=True, default=dict),
        ),
    ]

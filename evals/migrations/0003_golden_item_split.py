"""Golden items get a split (train, validation or test): every existing item is dealt one by the rule new
items get (evals/splits.py), set by set, in each set's order, so a set seeded before splits existed holds the
splits the same set seeded now would."""

from django.db import migrations, models


def deal_splits(apps, schema_editor):
    from evals import splits
    from evals.conf import eval_settings

    conf = eval_settings()
    GoldenSet = apps.get_model("evals", "GoldenSet")
    GoldenItem = apps.get_model("evals", "GoldenItem")
    for golden_set in GoldenSet.objects.order_by("pk").only("pk", "name").iterator():
        dealer = splits.dealer(seed=golden_set.name, proportions=conf.split_proportions,
                               min_items=conf.min_split_items)
        items = list(GoldenItem.objects.filter(golden_set_id=golden_set.pk).order_by("position", "pk")
                     .only("pk", "tags", "metadata", "content_hash"))
        for item in items:
            item.split = dealer.deal(splits.stratum_of(item.tags), splits.item_key(item.metadata, item.content_hash))
        GoldenItem.objects.bulk_update(items, ["split"], batch_size=1000)


class Migration(migrations.Migration):

    dependencies = [
        ('evals', '0002_eval_run_parent_run_active_index'),
    ]

    operations = [
        migrations.AddField(
            model_name='goldenitem',
            name='split',
            field=models.CharField(choices=[('train', 'Train'), ('validation', 'Validation'), ('test', 'Test')],
                                   default='train', help_text='train, validation or test: where evolution uses the item '
                                                         '(dealt by its first tag when it is added; editable).',
                                   max_length=10),
            preserve_default=False,
        ),
        migrations.AddConstraint(
            model_name='goldenitem',
            constraint=models.CheckConstraint(condition=models.Q(('split__in', ['train', 'validation', 'test'])),
                                              name='evals_goldenitem_known_split',
                                              violation_error_message="An item's split is train, validation or test."),
        ),
        # after the schema changes: rows updated before an ALTER TABLE in one transaction would hold it up
        migrations.RunPython(deal_splits, migrations.RunPython.noop, elidable=True),
    ]

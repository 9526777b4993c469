"""Every version's `dsl_hash` recomputed with the canonical form that keeps the order of `handOffs` and
`waitFor` (the runner's order) and sorts only the tool and skill lists.

The hashes stored before were of a form that sorted every list. The new form is finer (two DSLs with
the same new hash had the same old one), so two versions of one workflow cannot collide; a row whose
new hash another version of its workflow already holds keeps its old hash all the same, rather than
failing the migration. Without the recomputation, posting a stored DSL again would miss its version
and write a second one.

The canonical form is copied here as it is at this migration (a migration must not follow later
changes of workflows/dsl.py).
"""

import hashlib
import json

from django.db import IntegrityError, migrations, transaction

HASHED_NODE_FIELDS = ("nodeId", "description", "systemPrompt", "gatewayModelId", "mcpTools", "codeTools",
                      "handOffs", "handOffType", "waitFor", "skills", "maxSteps", "requiresApproval")
LIST_FIELDS = ("mcpTools", "codeTools", "handOffs", "waitFor", "skills")
SET_FIELDS = ("mcpTools", "codeTools", "skills")


def _hash(dsl: dict, *, ordered: bool) -> str:
    nodes = []
    for node in dsl["nodes"]:
        item = {field: node.get(field) for field in HASHED_NODE_FIELDS}
        for field in LIST_FIELDS:
            values = dict.fromkeys(node.get(field) or [])
            item[field] = list(values) if ordered and field not in SET_FIELDS else sorted(values)
        nodes.append(item)
    out = {key: value for key, value in dsl.items() if key != "nodes"}
    out["nodes"] = sorted(nodes, key=lambda node: node["nodeId"])
    text = json.dumps(out, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def rehash(apps, *, ordered: bool = True) -> int:
    """Recompute the stored hashes (`ordered`: the new form; False: the form before). Returns how many
    changed."""
    WorkflowVersion = apps.get_model("workflows", "WorkflowVersion")
    changed = 0
    rows = WorkflowVersion.objects.order_by("pk")
    for pk, dsl, stored in rows.values_list("pk", "dsl", "dsl_hash").iterator(chunk_size=500):
        digest = _hash(dsl, ordered=ordered)
        if digest == stored:
            continue
        try:
            with transaction.atomic():  # a savepoint: a collision keeps this row's hash, not the whole run
                WorkflowVersion.objects.filter(pk=pk).update(dsl_hash=digest)
        except IntegrityError:
            continue
        changed += 1
    return changed


def forward(apps, schema_editor):
    rehash(apps, ordered=True)


def backward(apps, schema_editor):
    rehash(apps, ordered=False)


class Migration(migrations.Migration):

    dependencies = [
        ("workflows", "0003_usd_precision"),
    ]

    operations = [
        migrations.RunPython(forward, backward),
    ]

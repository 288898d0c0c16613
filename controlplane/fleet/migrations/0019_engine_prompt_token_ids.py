from django.db import migrations

# The seeded models served by tinylm's engine, which now takes the prompt's token ids. The input is written out
# here, not read from the seed module, so this migration stays what it was whatever the seed becomes.
_NAMES = ("tinylm", "smollm2-135m-instruct")
_INPUT = {"name": "prompt_token_ids", "datatype": "INT32", "dims": [-1]}


def declare(apps, schema_editor):
    """Add the input to the seeded engine models' interface; an entry an operator changed keeps its other inputs."""
    CatalogueModel = apps.get_model("fleet", "CatalogueModel")
    for model in CatalogueModel.objects.filter(name__in=_NAMES):
        inputs = list(model.inputs or [])
        if not any(isinstance(spec, dict) and spec.get("name") == _INPUT["name"] for spec in inputs):
            model.inputs = [*inputs, dict(_INPUT)]
            model.save(update_fields=["inputs"])


def undeclare(apps, schema_editor):
    CatalogueModel = apps.get_model("fleet", "CatalogueModel")
    for model in CatalogueModel.objects.filter(name__in=_NAMES):
        model.inputs = [s for s in model.inputs or [] if not (isinstance(s, dict) and s.get("name") == _INPUT["name"])]
        model.save(update_fields=["inputs"])


class Migration(migrations.Migration):
    dependencies = [("fleet", "0018_cataloguemodel_call_rows")]
    operations = [migrations.RunPython(declare, undeclare)]

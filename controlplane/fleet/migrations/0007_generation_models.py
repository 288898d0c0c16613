import importlib

from django.db import migrations, models

# Module names starting with a digit cannot be imported with a plain import statement.
_seed_catalogue = importlib.import_module("controlplane.fleet.migrations.0002_seed_catalogue")


class Migration(migrations.Migration):
    """Generation models: their kind, what parsing and running their lines needs, and the shipped tinylm."""

    dependencies = [("fleet", "0006_fleet_size")]

    operations = [
        migrations.AlterField(
            model_name="cataloguemodel",
            name="kind",
            field=models.CharField(
                choices=[
                    ("embeddings", "Text embeddings (/v1/embeddings)"),
                    ("tensor", "Generic tensors (KServe v2 body, /v2/infer)"),
                    ("generation", "Text generation (/v1/chat/completions, /v1/completions)"),
                ],
                max_length=32,
            ),
        ),
        migrations.AddField(
            model_name="cataloguemodel",
            name="context_length",
            field=models.PositiveIntegerField(blank=True, help_text="Tokens: prompt + completion.", null=True),
        ),
        migrations.AddField(
            model_name="cataloguemodel",
            name="tokenizer_dir",
            field=models.CharField(blank=True, db_default="", default="", max_length=500),
        ),
        migrations.AddField(
            model_name="cataloguemodel",
            name="completion_weight",
            field=models.FloatField(db_default=1.0, default=1.0),
        ),
        migrations.AddField(
            model_name="cataloguemodel",
            name="max_num_seqs",
            field=models.PositiveIntegerField(blank=True, null=True),
        ),
        # The seed again, now that tinylm's fields exist (0002 created it without them on a fresh database).
        migrations.RunPython(_seed_catalogue.seed, migrations.RunPython.noop),
    ]

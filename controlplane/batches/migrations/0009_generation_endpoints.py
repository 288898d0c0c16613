from django.db import migrations, models


class Migration(migrations.Migration):
    """The generation endpoints join Batch.endpoint's choices (kinds/registry.KINDS)."""

    dependencies = [("batches", "0008_shard_body_errors")]

    operations = [
        migrations.AlterField(
            model_name="batch",
            name="endpoint",
            field=models.CharField(
                choices=[
                    ("/v1/embeddings", "Embeddings"),
                    ("/v2/infer", "Tensors"),
                    ("/v1/chat/completions", "Chat Completions"),
                    ("/v1/completions", "Completions"),
                ],
                max_length=64,
            ),
        ),
    ]

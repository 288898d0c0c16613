from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("batches", "0017_shard_adapter_usage"),
    ]

    operations = [
        migrations.AddField(
            model_name="shard",
            name="adapter_lines",
            field=models.JSONField(blank=True, null=True),
        ),
    ]

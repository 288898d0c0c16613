from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("batches", "0007_shard_columns"),
    ]

    operations = [
        migrations.AddField(
            model_name="batch",
            name="rerun_error_codes",
            field=models.JSONField(blank=True, null=True),
        ),
    ]

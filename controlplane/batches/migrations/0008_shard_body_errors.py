from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("batches", "0007_shard_columns"),
    ]

    operations = [
        migrations.AddField(
            model_name="shard",
            name="body_errors",
            field=models.PositiveIntegerField(db_default=0, default=0),
        ),
    ]

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("fleet", "0016_catalogue_adapters"),
    ]

    operations = [
        migrations.AddField(
            model_name="catalogueadapter",
            name="last_active_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
    ]

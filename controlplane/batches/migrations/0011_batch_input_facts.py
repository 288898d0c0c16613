"""The batch keeps what it needs of its input file (Batch.input_storage_name, Batch.input_line_count); existing
rows are filled from their file's row, or, where the row is gone (deleted after the batch ended, or a re-run's
input not built yet), with the name files/services.py gives every stored file."""

from django.db import migrations, models
from django.db.models import CharField, F, OuterRef, Subquery, Value
from django.db.models.functions import Cast, Coalesce, Concat


def backfill(apps, schema_editor):
    Batch = apps.get_model("batches", "Batch")
    File = apps.get_model("files", "File")
    row = File.objects.filter(id=OuterRef("input_file_id"), tenant_id=OuterRef("tenant_id"))
    given_name = Concat(Value("files/"), Cast("tenant_id", CharField()), Value("/"), F("input_file_id"))
    Batch.objects.update(
        input_storage_name=Coalesce(Subquery(row.values("storage_name")[:1]), given_name, output_field=CharField()),
        input_line_count=Subquery(row.values("line_count")[:1]),
    )


class Migration(migrations.Migration):
    dependencies = [
        ("batches", "0010_merge_generation_endpoints"),
        ("files", "0003_expires_at_and_storage_name_index"),
    ]

    operations = [
        migrations.AddField(
            model_name="batch",
            name="input_line_count",
            field=models.PositiveBigIntegerField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="batch",
            name="input_storage_name",
            field=models.CharField(blank=True, db_default="", default="", max_length=500),
        ),
        migrations.RunPython(backfill, migrations.RunPython.noop),
    ]

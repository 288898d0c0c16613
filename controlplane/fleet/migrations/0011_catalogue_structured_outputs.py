from django.db import migrations, models

from controlplane.fleet.catalogue.seed import SEED


def mark_seeded(apps, schema_editor):
    """The seeded models whose engine constrains decoding (tinylm) say so; nothing else of the rows is touched
    (re-seeding would overwrite measured speeds)."""
    CatalogueModel = apps.get_model("fleet", "CatalogueModel")
    names = [entry["name"] for entry in SEED if entry.get("structured_outputs")]
    CatalogueModel.objects.filter(name__in=names).update(structured_outputs=True)


class Migration(migrations.Migration):
    dependencies = [
        ("fleet", "0010_merge_moves_expected_completion"),
    ]

    operations = [
        migrations.AddField(
            model_name="cataloguemodel",
            name="structured_outputs",
            field=models.BooleanField(db_default=False, default=False),
        ),
        migrations.RunPython(mark_seeded, migrations.RunPython.noop),
    ]

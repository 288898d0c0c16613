from django.db import migrations

from controlplane.fleet.catalogue.seed import SEED


def seed(apps, schema_editor):
    CatalogueModel = apps.get_model("fleet", "CatalogueModel")
    # SEED grows with the model; a historical model only takes the fields it had then.
    known = {f.name for f in CatalogueModel._meta.get_fields()}
    for entry in SEED:
        CatalogueModel.objects.update_or_create(
            name=entry["name"], defaults={k: v for k, v in entry.items() if k in known}
        )


def unseed(apps, schema_editor):
    apps.get_model("fleet", "CatalogueModel").objects.filter(name__in=[e["name"] for e in SEED]).delete()


class Migration(migrations.Migration):
    dependencies = [("fleet", "0001_initial")]
    operations = [migrations.RunPython(seed, unseed)]

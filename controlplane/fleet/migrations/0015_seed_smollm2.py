from django.db import migrations

from controlplane.fleet.catalogue.seed import SEED

_NAME = "smollm2-135m-instruct"


def seed_smollm2(apps, schema_editor):
    """The real instruct LLM's catalogue entry; the other entries, which operators may have changed, are left."""
    CatalogueModel = apps.get_model("fleet", "CatalogueModel")
    known = {f.name for f in CatalogueModel._meta.get_fields()}
    entry = next(e for e in SEED if e["name"] == _NAME)
    CatalogueModel.objects.update_or_create(name=_NAME, defaults={k: v for k, v in entry.items() if k in known})


def unseed_smollm2(apps, schema_editor):
    apps.get_model("fleet", "CatalogueModel").objects.filter(name=_NAME).delete()


class Migration(migrations.Migration):
    dependencies = [("fleet", "0014_placement_load_failures_and_call_speed")]
    operations = [migrations.RunPython(seed_smollm2, unseed_smollm2)]

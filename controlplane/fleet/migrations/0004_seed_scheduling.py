import importlib

from django.db import migrations

# Module names starting with a digit cannot be imported with a plain import statement.
_seed_catalogue = importlib.import_module("controlplane.fleet.migrations.0002_seed_catalogue")


class Migration(migrations.Migration):
    """Re-apply the seed so the shipped models get their declared seconds per work unit."""

    dependencies = [("fleet", "0003_scheduling_fields")]
    operations = [migrations.RunPython(_seed_catalogue.seed, migrations.RunPython.noop)]

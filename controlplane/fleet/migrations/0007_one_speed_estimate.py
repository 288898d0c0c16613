from django.db import migrations, models


class Migration(migrations.Migration):
    """A model's speed is one estimate now, ``seconds_per_work_unit`` (scheduling/claims.py measures it; the
    planner derives lines/s from it). ``lines_per_second_per_instance`` leaves the code; its column stays one
    release for the rolling upgrade (docs/operations/upgrades.md, expand/contract): the last release still reads and
    writes it, and this release's INSERTs leave it out, so it gets a database default. The next release drops
    the column."""

    dependencies = [("fleet", "0006_fleet_size")]
    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[
                migrations.AlterField(
                    model_name="cataloguemodel",
                    name="lines_per_second_per_instance",
                    field=models.FloatField(default=0.0, db_default=0.0),
                )
            ],
            state_operations=[
                migrations.RemoveField(model_name="cataloguemodel", name="lines_per_second_per_instance")
            ],
        )
    ]

from django.db import migrations

# bench/token_costs.py (2026-12-02): a completion token costs tinylm's engine ~20x a prompt token.
MEASURED = 20.0


def forward(apps, schema_editor):
    # Only a row still at the old unmeasured default: an operator's own weight stays.
    apps.get_model("fleet", "CatalogueModel").objects.filter(name="tinylm", completion_weight=1.0).update(
        completion_weight=MEASURED
    )


def backward(apps, schema_editor):
    apps.get_model("fleet", "CatalogueModel").objects.filter(name="tinylm", completion_weight=MEASURED).update(
        completion_weight=1.0
    )


class Migration(migrations.Migration):
    """tinylm's completion_weight, measured (fleet/catalogue/seed.py has the figures)."""

    dependencies = [("fleet", "0010_merge_moves_expected_completion")]
    operations = [migrations.RunPython(forward, backward)]

# Two 0011 migrations (structured_outputs, tinylm's measured completion_weight) meet here.

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("fleet", "0011_catalogue_structured_outputs"),
        ("fleet", "0011_tinylm_measured_completion_weight"),
    ]

    operations = []

"""AuditEntry now belongs to core (core 0003): forget it here without touching its table."""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("console", "0002_roles"),
        ("core", "0003_auditentry"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(state_operations=[migrations.DeleteModel(name="AuditEntry")]),
    ]

"""AuditEntry moves from console to core (every app's admin writes it, and core is the floor they all may
import). The table and its rows stay where they are (``console_auditentry``); only Django's state moves, and the
content type is relabelled so the permission rows (``run_admin_actions``, the view/change ones) and the roles'
grants of them are kept."""

from django.db import migrations, models


def relabel_content_type(apps, schema_editor):
    ContentType = apps.get_model("contenttypes", "ContentType")
    if not ContentType.objects.filter(app_label="core", model="auditentry").exists():
        ContentType.objects.filter(app_label="console", model="auditentry").update(app_label="core")


def relabel_content_type_back(apps, schema_editor):
    ContentType = apps.get_model("contenttypes", "ContentType")
    if not ContentType.objects.filter(app_label="console", model="auditentry").exists():
        ContentType.objects.filter(app_label="core", model="auditentry").update(app_label="console")


class Migration(migrations.Migration):
    dependencies = [
        ("core", "0002_outbox"),
        ("console", "0002_roles"),
        ("contenttypes", "0002_remove_content_type_name"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.CreateModel(
                    name="AuditEntry",
                    fields=[
                        (
                            "id",
                            models.BigAutoField(
                                auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                            ),
                        ),
                        ("created_at", models.DateTimeField(auto_now_add=True, db_index=True)),
                        ("actor", models.CharField(help_text="Username at the time of the action", max_length=150)),
                        ("actor_id", models.BigIntegerField(blank=True, null=True)),
                        ("action", models.CharField(db_index=True, max_length=100)),
                        ("app_label", models.CharField(max_length=100)),
                        ("model", models.CharField(max_length=100)),
                        (
                            "object_id",
                            models.CharField(blank=True, default="", help_text="First of the objects", max_length=255),
                        ),
                        ("object_repr", models.CharField(blank=True, default="", max_length=500)),
                        ("details", models.JSONField(blank=True, default=dict)),
                    ],
                    options={
                        "verbose_name_plural": "audit entries",
                        "db_table": "console_auditentry",
                        "ordering": ["-created_at", "-id"],
                        "permissions": [
                            ("run_admin_actions", "Can run the admin's list actions (requeue, cancel, drain, …)")
                        ],
                    },
                ),
            ],
            database_operations=[],
        ),
        migrations.RunPython(relabel_content_type, relabel_content_type_back),
    ]

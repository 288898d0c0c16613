"""The viewer, operator and admin groups (controlplane/console/roles.py). It runs after the apps' migrations
that existed when the roles were introduced, so their permissions join the roles at once; `migrate` and
`manage.py roles_sync` bring later models in (apps.py, roles.py)."""

from django.db import migrations


def create_roles(apps, schema_editor):
    from controlplane.console.roles import roles_sync

    roles_sync(apps=apps)


def delete_roles(apps, schema_editor):
    from controlplane.console.roles import ROLES

    apps.get_model("auth", "Group").objects.filter(name__in=ROLES).delete()


class Migration(migrations.Migration):
    dependencies = [
        ("console", "0001_initial"),
        ("auth", "0012_alter_user_first_name_max_length"),
        ("contenttypes", "0002_remove_content_type_name"),
        ("core", "0002_outbox"),
        ("tenants", "0005_storage_quota"),
        ("files", "0003_expires_at_and_storage_name_index"),
        ("fleet", "0005_catalogue_created_at"),
        ("batches", "0005_lifecycle_and_pinning"),
        ("scheduling", "0001_initial"),
        ("webhooks", "0001_initial"),
    ]

    operations = [migrations.RunPython(create_roles, delete_roles)]

from django.apps import AppConfig


class BatchesConfig(AppConfig):
    name = "controlplane.batches"
    label = "batches"

    def ready(self) -> None:
        # Fleet sits below the batch pipeline and reads shard facts only through this port (fleet/work.py).
        from controlplane.batches.results.file_use import BatchFileUse
        from controlplane.batches.run.work_facts import ShardWork
        from controlplane.files.in_use import file_user_register
        from controlplane.fleet.work import work_source_register

        work_source_register(ShardWork())
        # Files sit below too: before deleting, expiring or collecting, they ask which files and blobs the
        # pipeline still needs (files/in_use.py).
        file_user_register(BatchFileUse())

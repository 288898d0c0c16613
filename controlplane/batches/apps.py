from django.apps import AppConfig


class BatchesConfig(AppConfig):
    name = "controlplane.batches"
    label = "batches"

    def ready(self) -> None:
        # Fleet sits below the batch pipeline and reads shard facts only through this port (fleet/work.py).
        from controlplane.batches.selectors import file_input_of_active_batch
        from controlplane.batches.work_facts import ShardWork
        from controlplane.files.in_use import file_in_use_register
        from controlplane.fleet.work import work_source_register

        work_source_register(ShardWork())
        # Files sit below too: they ask whether a batch still reads a file before deleting it (files/in_use.py).
        file_in_use_register(file_input_of_active_batch)

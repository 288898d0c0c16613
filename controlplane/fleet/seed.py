"""Catalogue entries for the models shipped in triton_models/ (plain data: migrations import it)."""

# The models shipped in triton_models/; operators add more in the admin.
SEED = [
    {
        "name": "all-MiniLM-L6-v2",
        "triton_name": "minilm",
        "kind": "embeddings",
        "max_batch_size": 64,
        "embedding_dimensions": 384,
        "inputs": [{"name": "TEXT", "datatype": "BYTES", "dims": [1]}],
        "outputs": [
            {"name": "EMBEDDING", "datatype": "FP32", "dims": [384]},
            {"name": "TOKENS", "datatype": "INT32", "dims": [1]},
        ],
        # ~90 MB of fp32 weights plus activations and the python backend stub: measured ~450 MB RSS.
        "memory_per_instance_bytes": 512 * 1024**2,
        "load_seconds": 15.0,
        "max_instances": 2,
        # ~40 lines/s of ~25 tokens per dispatch slot on this 2-core host: shards of ~0.5 s are ~500 tokens.
        "seconds_per_work_unit": 0.001,
    },
    {
        "name": "identity",
        "triton_name": "identity",
        "kind": "tensor",
        "max_batch_size": 1024,
        "inputs": [{"name": "INPUT0", "datatype": "FP32", "dims": [-1]}],
        "outputs": [{"name": "OUTPUT0", "datatype": "FP32", "dims": [-1]}],
        # Declared until measured: lets the first reconcile size a flood before any shard has finished.
        "memory_per_instance_bytes": 64 * 1024**2,
        "load_seconds": 2.0,
        "max_instances": 4,
        # A [1, 4] row costs the control plane ~0.3 ms; the model itself nearly nothing.
        "seconds_per_work_unit": 0.0003,
    },
    {
        "name": "scale2",
        "triton_name": "scale2",
        "kind": "tensor",
        "max_batch_size": 256,
        "inputs": [{"name": "INPUT0", "datatype": "FP32", "dims": [-1]}],
        "outputs": [{"name": "OUTPUT0", "datatype": "FP32", "dims": [-1]}],
        # Declared until measured: lets the first reconcile size a flood before any shard has finished.
        "memory_per_instance_bytes": 64 * 1024**2,
        "load_seconds": 2.0,
        "max_instances": 4,
        # A [1, 4] row costs the control plane ~0.3 ms; the model itself nearly nothing.
        "seconds_per_work_unit": 0.0003,
    },
]

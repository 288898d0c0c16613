"""torch -> ONNX -> TensorRT pipeline: one TOML spec per model in build_engines/specs/.

Run `python -m build_engines --help`. Nothing here imports the control plane, and the control plane only
reads what this package writes (model folders under triton_models/, manifest.json files).
"""

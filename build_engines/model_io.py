"""Loading a spec's torch model and tokenizer, and producing the inputs every stage runs on.

Export, verify and the TensorRT parity check all draw inputs here, so a case that passes in one stage is
the same case in the next.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from build_engines.errors import SpecError
from build_engines.spec import ModelSpec

NUMPY_DTYPES = {"int32": np.int32, "int64": np.int64, "fp16": np.float16, "fp32": np.float32}
Feeds = dict[str, np.ndarray]


def load_reference(spec: ModelSpec, ref: str, field: str) -> Callable[[], Any]:
    module_name, _, attr = ref.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise SpecError(spec.path, [(field, f"cannot import module {module_name!r}: {exc}")]) from exc
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise SpecError(spec.path, [(field, f"module {module_name!r} has no callable {attr!r}")])
    return factory  # type: ignore[no-any-return]


def load_source(spec: ModelSpec) -> Any:
    """Build the torch module in eval mode and check its forward() takes exactly the spec's inputs."""
    import torch

    model = load_reference(spec, spec.source, "source")()
    if not isinstance(model, torch.nn.Module):
        raise SpecError(
            spec.path, [("source", f"{spec.source} returned {type(model).__name__}, not a torch.nn.Module")]
        )
    model.eval()
    params = inspect.signature(model.forward).parameters
    accepts_any = any(p.kind == p.VAR_KEYWORD for p in params.values())
    problems = []
    for i, tensor in enumerate(spec.inputs):
        if tensor.name not in params and not accepts_any:
            problems.append(
                (
                    f"inputs[{i}].name",
                    f"{spec.source}'s forward() has no argument {tensor.name!r} (it takes {', '.join(params)})",
                )
            )
    listed = {t.name for t in spec.inputs}
    for name, param in params.items():
        required = param.default is param.empty and param.kind in (param.POSITIONAL_OR_KEYWORD, param.KEYWORD_ONLY)
        if required and name not in listed:
            problems.append(("inputs", f"{spec.source}'s forward() requires {name!r}, which the spec does not list"))
    if problems:
        raise SpecError(spec.path, problems)
    return model


def load_tokenizer(spec: ModelSpec) -> Any:
    assert spec.text is not None
    return load_reference(spec, spec.text.tokenizer, "text.tokenizer")()


def random_inputs(spec: ModelSpec, sizes: dict[str, int], rng: np.random.Generator) -> Feeds:
    feeds: Feeds = {}
    for i, tensor in enumerate(spec.inputs):
        shape = spec.concrete_shape(tensor.shape, sizes)
        dtype = NUMPY_DTYPES[tensor.dtype]
        if tensor.values == "ones":
            feeds[tensor.name] = np.ones(shape, dtype=dtype)
        elif tensor.values == "mask":
            if len(shape) != 2:
                raise SpecError(spec.path, [(f"inputs[{i}].values", "'mask' needs a [batch, sequence] shape")])
            lengths = rng.integers(1, shape[1] + 1, size=shape[0])
            lengths[0] = shape[1]  # one full-length row, so the profile's sequence size is really exercised
            feeds[tensor.name] = (np.arange(shape[1])[None, :] < lengths[:, None]).astype(dtype)
        elif np.issubdtype(dtype, np.integer):
            feeds[tensor.name] = rng.integers(int(tensor.low), int(tensor.high), size=shape).astype(dtype)
        else:
            feeds[tensor.name] = rng.uniform(tensor.low, tensor.high, size=shape).astype(dtype)
    return feeds


def corpus_batches(spec: ModelSpec, tokenizer: Any, batch_size: int) -> Iterator[tuple[int, Feeds]]:
    """Tokenise the spec's real sentences the way the served model will, in batches within the profile."""
    assert spec.text is not None
    sentences = [line.strip() for line in spec.text.corpus.read_text("utf-8").splitlines() if line.strip()]
    seq_axis = spec.inputs[0].shape[-1]
    min_len = spec.profile["min"].get(seq_axis, 1) if isinstance(seq_axis, str) else 1
    for start in range(0, len(sentences), batch_size):
        encoded = tokenizer(
            sentences[start : start + batch_size],
            padding="longest",
            truncation=True,
            max_length=spec.text.max_length,
            return_tensors="np",
        )
        feeds = {}
        for tensor in spec.inputs:
            array = np.asarray(encoded[tensor.name]).astype(NUMPY_DTYPES[tensor.dtype])
            if array.shape[1] < min_len:  # pad with zeros (pad id, masked out) up to the profile minimum
                array = np.pad(array, ((0, 0), (0, min_len - array.shape[1])))
            feeds[tensor.name] = array
        yield start, feeds


def torch_outputs(spec: ModelSpec, model: Any, feeds: Feeds) -> list[np.ndarray]:
    import torch

    with torch.inference_mode():
        result = model(**{name: torch.from_numpy(array) for name, array in feeds.items()})
    if isinstance(result, torch.Tensor):
        tensors = [result]
    elif isinstance(result, dict):
        tensors = list(result.values())
    else:
        tensors = list(result)
    if len(tensors) != len(spec.outputs):
        raise SpecError(
            spec.path, [("outputs", f"the model returns {len(tensors)} tensors but the spec lists {len(spec.outputs)}")]
        )
    return [t.detach().float().cpu().numpy() for t in tensors]


def example_inputs(spec: ModelSpec) -> Feeds:
    """Export traces at the opt shape: the shape TensorRT tunes for, and one that is not degenerate (size 1)."""
    return random_inputs(spec, spec.profile["opt"], np.random.default_rng(0))

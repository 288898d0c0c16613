"""A batch runs against the catalogue entry it was validated against.

Validation stores the entry's interface on the batch (``Batch.model_snapshot``); execution parses lines
and builds Triton calls from that snapshot, so an operator who edits, disables or re-registers the model
while a batch runs (other tensor names, another ``max_batch_size``) cannot fail its remaining lines.
What is pinned is the interface this service controls. The weights are Triton's: a request names the
model, not a version, so Triton serves the version its policy loads (build_engines emits version 1 only).
"""

from __future__ import annotations

from typing import Any

from controlplane.fleet.models import CatalogueModel

# Everything that parsing a line and building its Triton call reads (batches/intake/requests.py and the kind, kinds/).
PINNED_FIELDS = (
    "name",
    "triton_name",
    "kind",
    "max_batch_size",
    "call_rows",
    "inputs",
    "outputs",
    "embedding_dimensions",
    # Generation models: the tokenizer and limits a line was counted with, and the fair-share weight.
    "context_length",
    "tokenizer_dir",
    "completion_weight",
    "max_num_seqs",
    # Whether response_format json_object / json_schema lines are accepted (the engine constrains decoding).
    "structured_outputs",
)


def model_snapshot(model: CatalogueModel) -> dict[str, Any]:
    return {field: getattr(model, field) for field in PINNED_FIELDS}


def pinned_model(snapshot: dict[str, Any]) -> CatalogueModel:
    """The snapshot as an unsaved CatalogueModel, so parsing and packing read it like the live entry.
    Never saved: placement and measurements go to the live row by name."""
    return CatalogueModel(**{field: snapshot[field] for field in PINNED_FIELDS if field in snapshot})

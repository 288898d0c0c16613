"""The statistics call the usage ledger attributes from: cumulative compute time grows with inferences."""

from __future__ import annotations

import numpy as np

from controlplane.triton.client import TritonClient


def test_compute_time_grows_after_inferences(identity: TritonClient) -> None:
    before = identity.model_compute_ns("identity")
    batch = np.ones((64, 128), dtype=np.float32)
    for _ in range(5):
        identity.infer("identity", {"INPUT0": batch}, ["OUTPUT0"])
    after = identity.model_compute_ns("identity")
    assert after > before >= 0
    # And it only grows. (Not "stays equal": Triton may record a call's statistics just after its response,
    # and other tests share this server's identity model, so a later read can be a little higher.)
    assert identity.model_compute_ns("identity") >= after

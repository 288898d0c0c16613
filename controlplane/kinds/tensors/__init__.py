"""The generic tensor kind, ``/v2/infer``: a KServe v2 inference request as a line's body, for any Triton model
in the catalogue (kind.py binds it to the endpoint-kind interface).

- Parsing a body: requests.py (the checked parse), values.py (KServe datatypes ↔ numpy, casts), quick.py
  (validation's fast lane: the same rules in plain Python), fast.py (re-reading validated lines at run time).
- Running a shard: columns.py (the arrays validation keeps so a shard parses no JSON), packing.py (lines
  stacked into calls, outputs cut back into KServe v2 responses).

Who may import it: the rest of kinds/ (registry.py binds the kind to its URL). Other apps reach it through
kinds.base and kinds.registry only (pyproject.toml, contract "Endpoint kinds' public surface"). Tests hold
the fast paths (quick, fast, columns) to the checked parse (tests/batches/intake/test_quickcheck.py,
tests/kinds/test_tensors_fastparse.py, tests/kinds/test_tensors_columns.py)."""

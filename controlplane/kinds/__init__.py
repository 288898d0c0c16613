"""Endpoint kinds: what one batch endpoint (``/v1/embeddings``, ``/v2/infer``, ``/v1/chat/completions``,
``/v1/completions``, ``/v1/responses``) means, behind one interface. A plain package, not a Django app.

- base.py: the interface (``EndpointKind``) and the values that cross it (parsed lines, outcomes, token counts,
  the backend a shard runs against).
- registry.py: the one table of kinds by endpoint URL, and what a worker loads ahead of its first shard.
- calls.py: request/response kinds' shared run (lines packed into Triton calls, several in flight).
- embeddings.py: ``/v1/embeddings``.
- generation/: ``/v1/chat/completions``, ``/v1/completions`` and ``/v1/responses`` (bodies, tokenizers, the
  engine's wire, the run, the rendering).
- tensors/: ``/v2/infer``, KServe v2 tensors for any Triton model (the checked parse, the fast paths, packing).

Who may use it: the batch pipeline and the scheduler, through base.py and registry.py only; everything else
here is the kinds' own (pyproject.toml, contract "Endpoint kinds' public surface"). kinds imports core, triton,
tenants, fleet, files and usage, never batches, scheduling, metrics or console (contract "Apps are layered")."""

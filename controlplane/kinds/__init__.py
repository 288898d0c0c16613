"""Endpoint kinds: what one batch endpoint (`/v1/embeddings`, `/v2/infer`, …) means, behind one interface
(base.EndpointKind), registered in one table (registry.KINDS). A plain package, not a Django app: it may
import core, triton, tenants, fleet, files and usage, never batches, scheduling, metrics or console. The wire
rules (generation_bodies, generation_render) are plain functions, tested without a database."""

"""OpenAI's Files API (``/v1/files``) and the blob storage under it: uploads (uploads.py guards the size and
hashes while streaming, linecount.py counts lines on the way), the File rows (models.py, written by services.py,
read by selectors.py), expiry (lifecycle.py's policy, retention.py's sweep), the tenant's storage quota
(quota.py), blob storage itself (storage.py, local or S3) and the orphan collector (storage_gc.py).

Who may use it: the batch pipeline, through services.py, selectors.py, lifecycle.py, quota.py, storage.py and the
in-use hook (in_use.py: a layer above registers who still needs a file); batches' beat tasks run storage_gc.py.
models.py, uploads, rendering and the expiry sweep are the app's own (pyproject.toml, contract "Files' public
surface")."""

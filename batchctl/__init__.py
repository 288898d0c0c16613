"""batchctl: the command-line client of the batch inference service.

It speaks only the public HTTP API, through the official openai SDK, so it runs anywhere a tenant does:
it never imports Django or the control plane."""

"""What many tests import: builders of batches, files and tenants, fake backends, running shards the way workers
run them, a tritonserver for a module, receivers for webhooks and OTLP spans, and the helpers of the stack tests."""

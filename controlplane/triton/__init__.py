"""The adapter to Triton Inference Server, the only package that imports tritonclient: client.py (calls,
model control and statistics over gRPC), streaming.py (generation over one bidirectional stream, many requests in
flight) and errors.py (a failed call is transient or permanent, and the retry of the transient ones).

Who may use it: any app above it (fleet, kinds, batches, scheduling, usage, metrics), through these three
modules. It imports only core."""

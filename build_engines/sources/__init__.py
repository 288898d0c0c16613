"""Model factories named by specs (`source = "build_engines.sources.<model>:<function>"`)."""

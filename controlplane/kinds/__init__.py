"""Endpoint kinds: what each endpoint's line body means, how it is run, and how its results are written.
Plain modules (no Django app, no models) so the wire rules can be tested without a database."""

"""Tenants and their API keys: the Tenant row with its priority, weight and quotas (models.py), keys created,
revoked and counted against the request rate (services.py), bearer-key authentication (auth.py), the rate headers
on every response (middleware.py) and the edge's key check that nginx asks before it reads an upload (views.py).

Who may use it: every app above reads models.py; the API's views authenticate with auth.py; the admin pauses a
tenant through services.py. Settings name the middleware and auth.py by dotted path."""

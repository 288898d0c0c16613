"""HTTP security settings (README, "Production settings"; `manage.py check --deploy` passes with those).

Off by default because the embedded default serves plain http on 127.0.0.1; production terminates TLS
(usually at a proxy that sets X-Forwarded-Proto) and turns these on."""

from __future__ import annotations

from controlplane.core.env import env_bool, env_int, env_list, env_pair

X_FRAME_OPTIONS = "DENY"  # the admin is never framed (clickjacking)
SESSION_COOKIE_SECURE = env_bool(
    "SESSION_COOKIE_SECURE", False, help="The admin's session cookie is sent over https only."
)
CSRF_COOKIE_SECURE = env_bool("CSRF_COOKIE_SECURE", False, help="The CSRF cookie is sent over https only.")
SECURE_SSL_REDIRECT = env_bool(
    "SECURE_SSL_REDIRECT", False, help="Plain http requests are redirected to https (but see SECURE_REDIRECT_EXEMPT)."
)
# Reached inside the cluster or host over plain http, without the proxy's X-Forwarded-Proto: liveness probes,
# Prometheus's scrape, and the Triton fleet agent's registration and drain (bearer tokens, never a browser).
SECURE_REDIRECT_EXEMPT = [r"^healthz$", r"^metrics$", r"^internal/"]
SECURE_HSTS_SECONDS = env_int(
    "SECURE_HSTS_SECONDS", 0, minimum=0, help="max-age of the Strict-Transport-Security header; 0: no header."
)
SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool(
    "SECURE_HSTS_INCLUDE_SUBDOMAINS", False, help="Strict-Transport-Security covers subdomains too."
)
SECURE_HSTS_PRELOAD = env_bool("SECURE_HSTS_PRELOAD", False, help="Strict-Transport-Security asks for preloading.")
# Only behind a proxy that always sets (overwrites) that header.
SECURE_PROXY_SSL_HEADER = env_pair(
    "SECURE_PROXY_SSL_HEADER",
    help="The header and value that mark a request as https, e.g. HTTP_X_FORWARDED_PROTO,https.",
)
CSRF_TRUSTED_ORIGINS = env_list(
    "CSRF_TRUSTED_ORIGINS",
    [],
    help="Origins of the admin's POSTs behind a TLS proxy on another origin, e.g. https://batch.example.com.",
)

"""Settings of the operators' console (dashboards, samples: console/samples.py; the beat entry is in
__init__.py) and the admin login throttle (console/login_throttle.py)."""

from __future__ import annotations

from controlplane.core.env import env_float, env_int, env_str

# How often beat stores a sample: 15 s resolves a shard-sized burst on the 1 h chart (240 points) and costs a
# handful of grouped queries, a few rows per model, per tick.
CONSOLE_SAMPLES_INTERVAL_SECONDS = env_float(
    "CONSOLE_SAMPLES_INTERVAL_SECONDS", 15.0, help="How often beat stores a sample for the operators' dashboards."
)
# The longest dashboard window (7 d) plus a day.
CONSOLE_SAMPLES_RETENTION_DAYS = env_int(
    "CONSOLE_SAMPLES_RETENTION_DAYS", 8, minimum=1, help="Dashboard samples older than this many days are pruned."
)

# Admin login throttling (console/login_throttle.py): failed POSTs to the admin's login page allowed per
# username and per client address in each fixed window; past either, 429 until the window ends. The per-username
# limit stops guessing one account's password from many addresses; the per-address one, one address trying many
# names. Both are small enough to make guessing hopeless and large enough for a person's typos.
ADMIN_LOGIN_WINDOW_SECONDS = env_int(
    "ADMIN_LOGIN_WINDOW_SECONDS", 300, minimum=1, help="Length of the admin login throttle's fixed window."
)
ADMIN_LOGIN_MAX_FAILURES_PER_USER = env_int(
    "ADMIN_LOGIN_MAX_FAILURES_PER_USER", 10, minimum=1, help="Failed admin logins per username in a window (then 429)."
)
ADMIN_LOGIN_MAX_FAILURES_PER_ADDRESS = env_int(
    "ADMIN_LOGIN_MAX_FAILURES_PER_ADDRESS",
    30,
    minimum=1,
    help="Failed admin logins per client address in a window (then 429).",
)
# The request header that holds the client's address when a proxy in front overwrites it (the shipped nginx sets
# X-Real-IP: "HTTP_X_REAL_IP"); empty: REMOTE_ADDR. Never a header a client could set through the proxy.
ADMIN_LOGIN_CLIENT_ADDRESS_HEADER = env_str(
    "ADMIN_LOGIN_CLIENT_ADDRESS_HEADER",
    "",
    help="The request header holding the client's address behind a proxy (e.g. HTTP_X_REAL_IP); empty: REMOTE_ADDR.",
)

"""`make serve`: Triton, web (127.0.0.1:8000), worker and beat in the foreground; Ctrl-C stops all.
Uses DATABASE_URL / CELERY_BROKER_URL when set, the embedded defaults otherwise. A process that crashes is
restarted with backoff and the restart is logged here (Stack(supervise=True))."""

from __future__ import annotations

import logging
import os
import signal
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from deploy.local.stack import DEFAULT_WARM_MODELS, SERVED_LLM, Stack  # noqa: E402


def main() -> int:
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    port = int(os.environ.get("PORT", "8000"))
    var_dir = Path(os.environ.get("CONTROLPLANE_VAR_DIR", REPO_ROOT / "var"))
    stack = Stack(var_dir=var_dir, web_port=port, supervise=True, warm_models=(*DEFAULT_WARM_MODELS, SERVED_LLM))
    stopping = False

    def stop(signum: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    with stack:
        print(
            f"serving on {stack.base_url}/v1 (admin: {stack.base_url}/admin/, fleet: "
            f"{stack.base_url}/admin/fleet/tritonserver/overview/); Triton gRPC {stack.triton_grpc_url} is "
            f"managed server {stack.triton_server_name!r} with {', '.join(stack.warm_models)} loaded; "
            f"logs in {stack.log_dir}. Ctrl-C stops everything.",
            flush=True,
        )
        # manage.py finds the runner's signing key in the var dir (var/secret_key), so no variable is needed.
        print("create a tenant: .venv/bin/python manage.py tenant_create NAME", flush=True)
        while not stopping:  # the stack's supervisor restarts what crashes
            time.sleep(0.5)
    return 0


if __name__ == "__main__":
    sys.exit(main())

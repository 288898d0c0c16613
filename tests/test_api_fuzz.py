"""Property-based fuzzing of the tenant API from its own OpenAPI schema (schemathesis).

Schemathesis reads ``/v1/openapi.json`` from Django's WSGI app in-process and sends, for every operation,
the schema's boundary and type-violating cases (coverage phase) and random valid and invalid requests
(fuzzing); the stateful test follows the schema's links (upload → create batch → retrieve, cancel,
delete its input, ...). All requests carry a real key of a test tenant and hit the real Postgres test
database, each in a savepoint of the test's transaction. Every answer must not be a 5xx, must be a
documented status with a documented content type, and must match the schema for that status (a 4xx is
the OpenAI error object); after a DELETE the object is gone, and what a create returned can be fetched.

Hypothesis runs derandomized, so CI sees the same cases on every run (~30 s here). For a longer hunt,
``FUZZ_MAX_EXAMPLES=500 FUZZ_RANDOM=1`` raises the fuzzing count and draws new cases each run.
"""

from __future__ import annotations

import os

import pytest
import schemathesis
from django.core.signals import request_finished, request_started
from django.core.wsgi import get_wsgi_application
from django.db import close_old_connections, transaction
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    ensure_resource_availability,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
    use_after_free,
)

MAX_EXAMPLES = int(os.environ.get("FUZZ_MAX_EXAMPLES", "20"))
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
]
STATEFUL_CHECKS = [*CHECKS, use_after_free, ensure_resource_availability]

schema = schemathesis.openapi.from_wsgi("/v1/openapi.json", get_wsgi_application())
schema.config.generation.update(
    max_examples=MAX_EXAMPLES,
    deterministic=not os.environ.get("FUZZ_RANDOM"),
    database="none",
    # Every request carries the tenant's real key (below); 401s are tests/test_api.py's business.
    with_security_parameters=False,
)
# "stateful" also turns on the dependency analysis that as_state_machine() uses beside the explicit links.
schema.config.phases.update(phases=["examples", "coverage", "fuzzing", "stateful"])


# Each test runs in a transaction that is rolled back (cheap, unlike flushing the tables after each of the
# ~20 operations' tests); every request runs in a savepoint of it (_call below).
pytestmark = pytest.mark.django_db


@pytest.fixture
def fuzz_tenant(tenant, monkeypatch):
    from controlplane.core.messaging import dispatch

    # A created batch's validate message goes nowhere: the HTTP answers are under test here.
    monkeypatch.setattr(dispatch, "send", lambda task_name, args: None)
    # Some thousand requests a minute with one key: lift its request rate so that every case reaches the
    # views (the 429 itself is tested in tests/test_api.py).
    tenant.max_requests_per_minute = 1_000_000
    tenant.save(update_fields=["max_requests_per_minute"])
    # The WSGI handler closes the database connection after a request that leaves it outside autocommit, as
    # the test's transaction does; Django's own test client turns that off the same way.
    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    try:
        yield tenant
    finally:
        request_started.connect(close_old_connections)
        request_finished.connect(close_old_connections)


def _auth(tenant) -> dict[str, str]:
    return {"Authorization": f"Bearer {tenant.raw_key}"}


def _call(case, **kwargs):
    # A savepoint per request, as its own transaction would be in production: a database error inside it
    # fails this case (the savepoint cannot be released) instead of poisoning every later request.
    with transaction.atomic():
        return case.call(**kwargs)


def test_the_fuzzers_key_reaches_the_views(fuzz_tenant):
    # Without this, a broken key would turn every case into a documented 401 and the fuzzing into a no-op.
    for path in ("/v1/files", "/v1/batches", "/v1/models"):
        assert _call(schema[path]["GET"].Case(), headers=_auth(fuzz_tenant)).status_code == 200


@schema.parametrize()
# No deadline: a request's time depends on the machine's load. The tenant lives through all cases on
# purpose: what one case uploads, later cases list and page through, as with a real tenant.
@settings(deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_api_fuzz(case, fuzz_tenant):
    headers = _auth(fuzz_tenant)
    case.validate_response(_call(case, headers=headers), checks=CHECKS, headers=headers)


def test_api_stateful(fuzz_tenant):
    headers = _auth(fuzz_tenant)

    class Workflow(schema.as_state_machine()):
        def get_call_kwargs(self, case):
            return {"headers": headers}

        def call(self, case, **kwargs):
            return _call(case, **kwargs)

        def validate_response(self, response, case, additional_checks=None, **kwargs):
            case.validate_response(response, checks=STATEFUL_CHECKS, headers=headers)

    Workflow.run(
        settings=settings(
            max_examples=max(10, MAX_EXAMPLES // 2),
            stateful_step_count=6,
            deadline=None,
            derandomize=not os.environ.get("FUZZ_RANDOM"),
            database=None,
            suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
        )
    )

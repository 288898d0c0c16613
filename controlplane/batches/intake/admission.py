"""Admission: at batch create, the priority class asked for and the tenant's quotas on work waiting; when
validation succeeds, the same quotas with the batch's exact counts (tokens are known only then), its output cap
and its expected results against the storage quota.

Both run under the tenant row lock, held until the caller's transaction writes the batch (create) or starts
it (validation), so two concurrent creates or validations of one tenant are counted one after the other and
cannot both slip under a limit only one fits. They only read; the caller writes.
"""

from __future__ import annotations

from typing import Any, Protocol

from django.conf import settings
from django.db.models import Q, Sum
from django.db.models.functions import Greatest
from django.utils import timezone

from controlplane.batches import selectors
from controlplane.batches.models import ACTIVE_STATUSES, Batch
from controlplane.batches.pinning import pinned_model
from controlplane.core.http.errors import QuotaExceeded, ValidationFailed
from controlplane.files.quota import storage_reserve_refusal
from controlplane.kinds.registry import kind_for, token_endpoint_urls
from controlplane.tenants.models import PRIORITY_RANK, Priority, Tenant, priority_parse
from controlplane.usage.spendcap import spend_cap_enforce

# Both quotas free up only when one of the tenant's batches ends, which takes minutes to hours, so no
# exact reset time exists. A minute is a fair poll interval: a client waiting that long rarely misses
# much, and one retrying in a loop costs one request a minute.
ADMISSION_RETRY_AFTER_SECONDS = 60
# The openai SDK retries a 429 by itself (twice, sleeping Retry-After): for a quota that frees up in
# minutes that only blocks the caller for two minutes before the same error, so tell it not to.
_NO_SDK_RETRY = {"x-should-retry": "false"}


class CountedInput(Protocol):
    """What admission reads of an input file (files' row, from files.selectors)."""

    @property
    def line_count(self) -> int | None: ...


def batch_admit(*, tenant: Tenant, input_file: CountedInput, priority: str | None) -> str:
    """Return the priority class the new batch gets, or raise ValidationFailed (400) for a priority the
    tenant may not use, QuotaExceeded (429) when the tenant is at its monthly spend cap, at its
    concurrent-batch limit, or the file's lines would take its enqueued lines over the limit.
    ``tenant`` must be the locked row."""
    # A file stored before uploads counted lines adds nothing here; validation still checks its real count.
    return batch_admit_lines(tenant=tenant, incoming_lines=input_file.line_count or 0, priority=priority)


def batch_admit_lines(*, tenant: Tenant, incoming_lines: int, priority: str | None) -> str:
    """``batch_admit`` for a batch whose input does not exist yet (a re-run's, built by its validation task
    from its source's failed lines): ``incoming_lines`` is what it will hold at most."""
    chosen = _priority_choose(tenant=tenant, priority=priority)
    spend_cap_enforce(tenant=tenant, now=timezone.now())
    active = selectors.batch_active_count(tenant=tenant)
    if active >= tenant.max_concurrent_batches:
        raise QuotaExceeded(
            f"Tenant has {active} active batches, the limit is {tenant.max_concurrent_batches}; "
            "wait for one to finish or cancel one.",
            code="concurrent_batches_limit_exceeded",
            limit="max_concurrent_batches",
            value=tenant.max_concurrent_batches,
            current=active,
            requested=1,
            retry_after=ADMISSION_RETRY_AFTER_SECONDS,
            headers=_NO_SDK_RETRY,
        )
    incoming = incoming_lines
    enqueued = selectors.batch_enqueued_lines(tenant=tenant)
    if enqueued + incoming > tenant.max_enqueued_lines:
        raise QuotaExceeded(
            f"The batch's {incoming} requests would bring the tenant's enqueued requests to "
            f"{enqueued + incoming}, over the limit of {tenant.max_enqueued_lines} ({enqueued} already "
            "enqueued); wait for a batch to finish, cancel one, or split the file.",
            code="enqueued_lines_limit_exceeded",
            limit="max_enqueued_lines",
            value=tenant.max_enqueued_lines,
            current=enqueued,
            requested=incoming,
            retry_after=ADMISSION_RETRY_AFTER_SECONDS,
            headers=_NO_SDK_RETRY,
        )
    return chosen


def _priority_choose(*, tenant: Tenant, priority: object) -> str:
    highest = Priority(tenant.max_priority)
    if priority is None:
        # Tenant.clean keeps the default at or below the maximum; for a row edited outside the admin, the
        # lower of the two rather than a 400 on every request that names no priority.
        return max(Priority(tenant.default_priority), highest, key=PRIORITY_RANK.__getitem__).value
    asked = priority_parse(priority)
    if asked is None:
        raise ValidationFailed(
            f"priority must be one of {', '.join(repr(p.value) for p in Priority)}, got {priority!r}.",
            param="priority",
            code="invalid_priority",
        )
    if PRIORITY_RANK[asked] < PRIORITY_RANK[highest]:
        raise ValidationFailed(
            f"priority {asked.value!r} is above the highest class allowed for this tenant, {highest.value!r}.",
            param="priority",
            code="priority_not_allowed",
        )
    return asked.value


def _refusal(code: str, message: str) -> dict[str, Any]:
    return {"code": code, "param": None, "line": None, "message": message}


def batch_admit_validated(
    *,
    batch: Batch,
    lines: int,
    work_units: int,
    quota_tokens: int,
    model_snapshot: dict[str, Any] | None,
    output_bytes: int = 0,
) -> tuple[dict[str, Any] | None, int]:
    """For a batch whose file just proved valid, inside the transaction that will start it: locks the tenant row
    and returns (the batch's error entry, or None when it may start; the bytes of results to reserve). Checks the
    tenant's enqueued lines and tokens across its other non-terminal batches with this batch's exact counts (tokens:
    ``quota_tokens``, where a generation line counts its prompt and n × max_tokens, so the output a tenant can have
    queued is bounded too), the per-batch output cap (BATCH_MAX_OUTPUT_BYTES) and the storage quota."""
    tenant = Tenant.objects.select_for_update().get(id=batch.tenant_id)
    kind = kind_for(batch.endpoint)
    others = (
        Batch.objects.filter(tenant_id=tenant.id, status__in=ACTIVE_STATUSES)
        .exclude(id=batch.id)
        .aggregate(
            lines=Sum("total_lines"),
            # A row from before quota_tokens was counted holds 0 there: its work units stand in.
            work=Sum(Greatest("quota_tokens", "work_units"), filter=Q(endpoint__in=token_endpoint_urls())),
        )
    )
    queued_lines = (others["lines"] or 0) + lines
    if queued_lines > tenant.max_enqueued_lines:
        return _refusal(
            "quota_exceeded",
            f"{lines} requests would bring the tenant's enqueued requests to {queued_lines}, "
            f"over the limit of {tenant.max_enqueued_lines}.",
        ), 0
    if kind.counts_tokens:
        queued_tokens = (others["work"] or 0) + quota_tokens
        if queued_tokens > tenant.max_enqueued_tokens:
            # OpenAI's code for the same condition, so clients can handle it the same way.
            return _refusal(
                "token_limit_exceeded",
                f"Enqueued token limit reached: this batch's ~{quota_tokens} tokens would bring the tenant's "
                f"enqueued tokens to ~{queued_tokens}, over the limit of {tenant.max_enqueued_tokens} (a generation "
                "line counts its prompt and n × max_tokens). Wait for other batches to finish or split the file.",
            ), 0
    expected = 0
    if model_snapshot is not None:
        expected = kind.output_bytes_estimate(
            lines=lines, work_units=work_units, model=pinned_model(model_snapshot), line_bytes=output_bytes
        )
    if expected > settings.BATCH_MAX_OUTPUT_BYTES:
        return _refusal(
            "output_too_large",
            f"The batch's results are expected to take ~{expected} bytes, over the limit of "
            f"{settings.BATCH_MAX_OUTPUT_BYTES} bytes per batch; split the file into smaller batches.",
        ), 0
    return storage_reserve_refusal(tenant=tenant, expected=expected), expected

"""expires_after parsing (files/lifecycle.py) and the storage-quota decision (files/quota.py), no database."""

from __future__ import annotations

import pytest
from django.http import QueryDict

from controlplane.core.http.errors import PayloadTooLarge, QuotaExceeded, ValidationFailed
from controlplane.files.lifecycle import expires_after_from_form, expires_after_parse
from controlplane.files.quota import StorageRoom


@pytest.mark.parametrize("seconds", [3600, 86400, 2592000])
def test_openais_range_is_accepted(seconds):
    assert expires_after_parse({"anchor": "created_at", "seconds": seconds}, param="p") == seconds


def test_absent_is_none():
    assert expires_after_parse(None, param="p") is None
    assert expires_after_from_form(QueryDict("purpose=batch")) is None


@pytest.mark.parametrize(
    ("value", "param"),
    [
        ({"anchor": "created_at", "seconds": 3599}, "p.seconds"),
        ({"anchor": "created_at", "seconds": 2592001}, "p.seconds"),
        ({"anchor": "created_at", "seconds": 3600.0}, "p.seconds"),
        ({"anchor": "created_at", "seconds": False}, "p.seconds"),
        ({"anchor": "created_at"}, "p.seconds"),
        ({"anchor": None, "seconds": 3600}, "p.anchor"),
        ({"anchor": "created_at", "seconds": 3600, "extra": 1}, "p"),
        ([3600], "p"),
    ],
)
def test_bad_values_name_the_field(value, param):
    with pytest.raises(ValidationFailed) as raised:
        expires_after_parse(value, param="p")
    assert raised.value.param == param


def test_the_form_carries_strings_in_bracketed_fields():
    form = QueryDict("purpose=batch&expires_after[anchor]=created_at&expires_after[seconds]=7200")
    assert expires_after_from_form(form) == 7200
    with pytest.raises(ValidationFailed, match="integer"):
        expires_after_from_form(QueryDict("expires_after[anchor]=created_at&expires_after[seconds]=-7200"))


def test_storage_room_decides_413_or_429():
    room = StorageRoom(quota=100, used=60)
    room.check(40)  # exactly full is allowed
    with pytest.raises(QuotaExceeded) as over:
        room.check(41)
    assert over.value.status_code == 429 and over.value.limit_body() == {
        "name": "storage_quota_bytes",
        "value": 100,
        "current": 60,
        "requested": 41,
    }
    with pytest.raises(PayloadTooLarge) as alone:
        room.check(101)
    assert alone.value.status_code == 413 and alone.value.code == "storage_quota_exceeded"
    assert room.read_limit(1000) == 100
    unlimited = StorageRoom(quota=None, used=0)
    unlimited.check(10**12)
    assert unlimited.read_limit(1000) == 1000

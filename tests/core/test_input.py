"""Request validation with the schema's serializers (core/http/input.py): the first DRF error becomes one
ValidationFailed in OpenAI's shape, with ``param`` the field's path."""

from __future__ import annotations

from typing import Any

import pytest
from rest_framework import serializers

from controlplane.core.http.errors import ValidationFailed
from controlplane.core.http.input import StrictBooleanField, StrictCharField, input_validate, strict_choice


class _Inner(serializers.Serializer[Any]):
    seconds = serializers.IntegerField(min_value=1)


class _Body(serializers.Serializer[Any]):
    name = StrictCharField()
    kinds = serializers.ListField(child=strict_choice(["a", "b"]), required=False)
    inner = _Inner(required=False)
    items = _Inner(many=True, required=False)
    flag = StrictBooleanField(required=False)


def _refusal(data: Any) -> ValidationFailed:
    with pytest.raises(ValidationFailed) as caught:
        input_validate(_Body, data)
    return caught.value


def test_valid_data_is_the_fields_sent():
    assert input_validate(_Body, {"name": "x", "flag": True, "unknown": 1}) == {"name": "x", "flag": True}


@pytest.mark.parametrize(
    ("data", "param", "code"),
    [
        ({}, "name", "missing_required_parameter"),
        ({"name": 5}, "name", "invalid_value"),  # DRF's CharField would take 5 as "5"
        ({"name": "x", "flag": "yes"}, "flag", "invalid_value"),  # and its BooleanField "yes" as True
        ({"name": "x", "kinds": ["a", "c"]}, "kinds[1]", "invalid_value"),
        ({"name": "x", "kinds": "a"}, "kinds", "invalid_value"),
        ({"name": "x", "inner": {"seconds": 0}}, "inner.seconds", "invalid_value"),
        ({"name": "x", "inner": {}}, "inner.seconds", "missing_required_parameter"),
        ({"name": "x", "items": [{"seconds": 1}, {"seconds": "many"}]}, "items[1].seconds", "invalid_value"),
    ],
)
def test_the_first_error_names_its_path(data, param, code):
    error = _refusal(data)
    assert (error.param, error.code) == (param, code)
    assert param in error.message


def test_messages_are_openais_and_bounded():
    assert _refusal({}).message == "Missing required parameter: 'name'."
    choice = _refusal({"name": "x", "kinds": ["c" * 5000]})
    assert choice.message.startswith("Invalid 'kinds[0]': expected one of 'a', 'b', got 'ccc")
    assert len(choice.message) <= 300


@pytest.mark.parametrize("data", [["name"], "name", 5, None])
def test_a_body_that_is_no_object_is_a_clear_400(data):
    error = _refusal(data)
    assert error.message == "The request body must be a JSON object." and error.status_code == 400

"""Request validation with DRF serializers, answered in OpenAI's error shape.

Each app's ``schema.py`` declares its request bodies and query parameters as serializers; drf-spectacular
publishes them in ``/v1/openapi.json`` and the views validate with the same classes (``input_validate``), so
the description and the checks cannot drift apart. The first error becomes one ``ValidationFailed`` with
``param`` = the field's path as OpenAI writes it (``output_expires_after.seconds``, ``event_types[0]``) and
OpenAI's codes (``missing_required_parameter``, else ``invalid_value``).

A rule the domain already owns (a completion window, an expiry object, metadata) is a field whose
``to_internal_value`` calls the domain's function: that raises ``ValidationFailed`` itself, which DRF does
not catch, so the message, ``param`` and code are the domain's, and the service checks other callers with
the same function.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rest_framework import serializers

from controlplane.core.http.errors import ValidationFailed, validation_failed


def input_validate(serializer_class: type[serializers.Serializer[Any]], data: Any) -> dict[str, Any]:
    """``data`` (a parsed body or the query parameters) validated by ``serializer_class``: its validated
    data with only the fields that were sent (and defaults), or ``ValidationFailed`` for the first error."""
    if not isinstance(data, Mapping):
        raise ValidationFailed("The request body must be a JSON object.")
    serializer = serializer_class(data=data)
    if not serializer.is_valid():
        raise validation_failed(serializer.errors)
    return dict(serializer.validated_data)


class StrictCharField(serializers.CharField):
    """A string, and only a string: DRF's CharField turns ``5`` into ``"5"``, OpenAI refuses it."""

    def to_internal_value(self, data: Any) -> str:
        if not isinstance(data, str):
            self.fail("invalid")
        return super().to_internal_value(data)


class StrictBooleanField(serializers.BooleanField):
    """``true`` or ``false``: DRF's BooleanField also takes ``"yes"``, ``1`` and ``"on"``."""

    def to_internal_value(self, data: Any) -> bool:
        if not isinstance(data, bool):
            self.fail("invalid", input=data)
        return data


def strict_choice(choices: list[str], **kwargs: Any) -> serializers.ChoiceField:
    """A ChoiceField whose refusal lists what is allowed."""
    allowed = ", ".join(repr(c) for c in choices)
    return serializers.ChoiceField(
        choices=choices, error_messages={"invalid_choice": f"expected one of {allowed}, got {{input!r}}."}, **kwargs
    )

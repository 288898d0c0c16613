"""Content negotiation for the views that answer bytes (file content, result streams)."""

from __future__ import annotations

from collections.abc import Iterable

from rest_framework.negotiation import BaseContentNegotiation
from rest_framework.parsers import BaseParser
from rest_framework.renderers import BaseRenderer
from rest_framework.request import Request


class AnyAccept(BaseContentNegotiation):
    """Bytes whatever the client accepts (the openai SDK asks for application/binary or application/json);
    an error still renders with the first renderer (JSON)."""

    def select_parser(self, request: Request, parsers: Iterable[BaseParser]) -> BaseParser | None:
        return next(iter(parsers))

    def select_renderer(
        self, request: Request, renderers: Iterable[BaseRenderer], format_suffix: str | None = None
    ) -> tuple[BaseRenderer, str]:
        renderer = next(iter(renderers))
        return renderer, renderer.media_type

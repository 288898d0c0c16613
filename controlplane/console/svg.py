"""Server-rendered SVG charts for the admin's dashboards: pure functions from series to an SVG string.

No Django, no clock, no JavaScript: the page embeds the string as it is (every text is escaped here). Each
plotted point is a ``<circle>`` and each bar a ``<rect>`` with ``data-series``, ``data-x`` and ``data-y``
attributes, so a browser test can count what was drawn, and a ``<title>`` so hovering shows the value."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from html import escape

# Categorical colours (Okabe–Ito, readable by colour-blind viewers), reused in turn past eight series.
PALETTE = ("#0072b2", "#e69f00", "#009e73", "#d55e00", "#cc79a7", "#56b4e9", "#f0e442", "#000000")
# Room around the plot for the axis labels (left), the tick labels (bottom) and the title and legend (top).
MARGIN_LEFT, MARGIN_RIGHT, MARGIN_TOP, MARGIN_BOTTOM = 64, 16, 44, 28
Y_TICKS = 4
X_TICKS = 5

Formatter = Callable[[float], str]


@dataclass(frozen=True)
class Series:
    """A named line: (x, y) points in x order; y None is a gap (the line breaks there, no point is drawn)."""

    name: str
    points: tuple[tuple[float, float | None], ...]


@dataclass(frozen=True)
class BarGroup:
    """One category on the x axis (a day) with one stacked value per series name (a tenant)."""

    label: str
    values: tuple[tuple[str, float], ...]


def nice_ceiling(value: float) -> float:
    """The smallest of 1, 2, 2.5, 5 × 10^k at or above value: a y-axis top whose ticks read well."""
    if value <= 0 or not math.isfinite(value):
        return 1.0
    exponent = math.floor(math.log10(value))
    base = 10.0**exponent
    for step in (1.0, 2.0, 2.5, 5.0, 10.0):
        if value <= step * base * (1 + 1e-9):
            return step * base
    return 10.0 * base  # unreachable: 10 × base is above value by the choice of exponent


def compact_number(value: float) -> str:
    """Tick and tooltip labels: 0, 0.25, 12, 3.4k, 1.2M."""
    magnitude = abs(value)
    for limit, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if magnitude >= limit:
            return f"{value / limit:.3g}{suffix}"
    return f"{value:.3g}"


def _attr(value: object) -> str:
    return escape(str(value), quote=True)


def _frame(title: str, width: int, height: int, body: list[str]) -> str:
    return "\n".join(
        [
            f'<svg xmlns="http://www.w3.org/2000/svg" class="cp-chart" width="{width}" height="{height}" '
            f'viewBox="0 0 {width} {height}" role="img" aria-label="{_attr(title)}">',
            f"<title>{escape(title)}</title>",
            f'<text x="{MARGIN_LEFT}" y="16" font-size="13" font-weight="600">{escape(title)}</text>',
            *body,
            "</svg>",
        ]
    )


def _legend(names: Sequence[str]) -> list[str]:
    parts, x = [], MARGIN_LEFT
    for i, name in enumerate(names):
        colour = PALETTE[i % len(PALETTE)]
        parts.append(f'<rect x="{x}" y="24" width="10" height="10" fill="{colour}"/>')
        parts.append(f'<text x="{x + 14}" y="33" font-size="11">{escape(name)}</text>')
        x += 24 + 7 * len(name)
    return parts


def _y_axis(top: float, width: int, height: int, y_label: str) -> list[str]:
    parts = []
    plot_h = height - MARGIN_TOP - MARGIN_BOTTOM
    for i in range(Y_TICKS + 1):
        value = top * i / Y_TICKS
        y = MARGIN_TOP + plot_h * (1 - i / Y_TICKS)
        parts.append(f'<line x1="{MARGIN_LEFT}" x2="{width - MARGIN_RIGHT}" y1="{y:.1f}" y2="{y:.1f}" stroke="#ddd"/>')
        parts.append(
            f'<text x="{MARGIN_LEFT - 6}" y="{y + 4:.1f}" font-size="10" text-anchor="end">'
            f"{escape(compact_number(value))}</text>"
        )
    mid = MARGIN_TOP + plot_h / 2
    parts.append(
        f'<text x="12" y="{mid:.1f}" font-size="10" text-anchor="middle" '
        f'transform="rotate(-90 12 {mid:.1f})">{escape(y_label)}</text>'
    )
    return parts


def _empty(title: str, width: int, height: int) -> str:
    return _frame(
        title,
        width,
        height,
        [
            f'<text class="cp-empty" x="{width / 2:.0f}" y="{height / 2:.0f}" font-size="12" '
            'text-anchor="middle" fill="#777">No data in this window</text>'
        ],
    )


def line_chart(
    series: Sequence[Series],
    *,
    title: str,
    y_label: str,
    width: int = 720,
    height: int = 240,
    x_format: Formatter = compact_number,
    y_format: Formatter = compact_number,
) -> str:
    """Lines on a shared x axis (usually epoch seconds) and a y axis from 0 to a nice ceiling."""
    values = [(x, y) for s in series for x, y in s.points if y is not None]
    if not values:
        return _empty(title, width, height)
    x_min, x_max = min(x for x, _ in values), max(x for x, _ in values)
    if x_max == x_min:  # one instant: centre it
        x_min, x_max = x_min - 1, x_max + 1
    top = nice_ceiling(max(max(y for _, y in values), 0.0))
    plot_w = width - MARGIN_LEFT - MARGIN_RIGHT
    plot_h = height - MARGIN_TOP - MARGIN_BOTTOM

    def sx(x: float) -> float:
        return MARGIN_LEFT + plot_w * (x - x_min) / (x_max - x_min)

    def sy(y: float) -> float:
        return MARGIN_TOP + plot_h * (1 - max(y, 0.0) / top)

    body = _legend([s.name for s in series]) + _y_axis(top, width, height, y_label)
    for i in range(X_TICKS):
        x = x_min + (x_max - x_min) * i / (X_TICKS - 1)
        anchor = "start" if i == 0 else "end" if i == X_TICKS - 1 else "middle"
        body.append(
            f'<text x="{sx(x):.1f}" y="{height - 8}" font-size="10" text-anchor="{anchor}">{escape(x_format(x))}</text>'
        )
    for i, s in enumerate(series):
        colour = PALETTE[i % len(PALETTE)]
        runs: list[list[str]] = [[]]
        for x, y in s.points:
            if y is None:
                runs.append([])
            else:
                runs[-1].append(f"{sx(x):.1f},{sy(y):.1f}")
        for run in runs:
            if len(run) > 1:
                body.append(f'<polyline fill="none" stroke="{colour}" stroke-width="1.5" points="{" ".join(run)}"/>')
        for x, y in s.points:
            if y is None:
                continue
            body.append(
                f'<circle class="cp-point" cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="2" fill="{colour}" '
                f'data-series="{_attr(s.name)}" data-x="{x:g}" data-y="{y:g}">'
                f"<title>{escape(s.name)}: {escape(y_format(y))} at {escape(x_format(x))}</title></circle>"
            )
    return _frame(title, width, height, body)


def bar_chart(
    groups: Sequence[BarGroup],
    *,
    title: str,
    y_label: str,
    width: int = 720,
    height: int = 240,
    y_format: Formatter = compact_number,
) -> str:
    """Stacked bars, one per group (category), one colour per series name in order of first appearance."""
    names: list[str] = []
    for group in groups:
        for name, _ in group.values:
            if name not in names:
                names.append(name)
    totals = [sum(max(v, 0.0) for _, v in g.values) for g in groups]
    if not groups or not names:
        return _empty(title, width, height)
    top = nice_ceiling(max(totals))
    plot_w = width - MARGIN_LEFT - MARGIN_RIGHT
    plot_h = height - MARGIN_TOP - MARGIN_BOTTOM
    slot = plot_w / len(groups)
    bar_w = max(2.0, slot * 0.7)
    body = _legend(names) + _y_axis(top, width, height, y_label)
    label_every = max(1, math.ceil(len(groups) / 10))  # at most ~10 category labels fit under the bars
    for gi, group in enumerate(groups):
        x = MARGIN_LEFT + slot * gi + (slot - bar_w) / 2
        base = 0.0
        for name, value in group.values:
            value = max(value, 0.0)
            h = plot_h * value / top
            y = MARGIN_TOP + plot_h * (1 - base / top) - h
            colour = PALETTE[names.index(name) % len(PALETTE)]
            body.append(
                f'<rect class="cp-bar" x="{x:.1f}" y="{y:.1f}" width="{bar_w:.1f}" height="{h:.1f}" '
                f'fill="{colour}" data-series="{_attr(name)}" data-x="{_attr(group.label)}" data-y="{value:g}">'
                f"<title>{escape(name)}: {escape(y_format(value))} on {escape(group.label)}</title></rect>"
            )
            base += value
        if gi % label_every == 0:
            body.append(
                f'<text x="{x + bar_w / 2:.1f}" y="{height - 8}" font-size="10" text-anchor="middle">'
                f"{escape(group.label)}</text>"
            )
    return _frame(title, width, height, body)

"""The dashboards' SVG charts: pure functions, so every property is checked on the string they return."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import pytest

from controlplane.console.svg import BarGroup, Series, bar_chart, compact_number, line_chart, nice_ceiling

NS = {"svg": "http://www.w3.org/2000/svg"}


def parse(chart: str) -> ET.Element:
    return ET.fromstring(chart)  # also proves the output is well-formed XML


@pytest.mark.parametrize(
    ("value", "top"),
    [(0, 1.0), (-3, 1.0), (0.7, 1.0), (1.0, 1.0), (1.2, 2.0), (2.2, 2.5), (3, 5.0), (7, 10.0), (1234, 2000.0)],
)
def test_nice_ceiling(value, top):
    assert nice_ceiling(value) == pytest.approx(top)


def test_compact_number():
    assert [compact_number(v) for v in (0, 0.25, 12, 3400, 1_200_000)] == ["0", "0.25", "12", "3.4k", "1.2M"]


def test_line_chart_draws_one_point_per_value_and_breaks_at_gaps():
    series = [
        Series("a", ((0, 1.0), (10, 2.0), (20, None), (30, 4.0), (40, 5.0))),
        Series("b", ((0, 0.5), (40, 0.5))),
    ]
    root = parse(line_chart(series, title="t", y_label="lines"))
    points = root.findall(".//svg:circle", NS)
    assert len(points) == 6
    assert [p.get("data-y") for p in points if p.get("data-series") == "a"] == ["1", "2", "4", "5"]
    # "a" is two runs around its gap, "b" one: three lines.
    assert len(root.findall(".//svg:polyline", NS)) == 3
    # y grows downwards: the larger value sits higher on the chart, and the axis top is a nice 5.
    cy = {p.get("data-y"): float(p.get("cy")) for p in points if p.get("data-series") == "a"}
    assert cy["5"] < cy["4"] < cy["1"]
    assert "5" in [t.text for t in root.findall(".//svg:text", NS)]


def test_line_chart_escapes_every_text():
    hostile = '<script>alert("x")</script>&'
    chart = line_chart(
        [Series(hostile, ((0, 1.0), (1, 2.0)))], title=hostile, y_label=hostile, x_format=lambda x: hostile
    )
    assert "<script>" not in chart
    root = parse(chart)
    assert root.find(".//svg:circle", NS).get("data-series") == hostile  # the attribute round-trips intact
    assert hostile in [t.text for t in root.findall(".//svg:text", NS)]


def test_empty_chart_says_so_and_has_no_points():
    for chart in (
        line_chart([], title="t", y_label="y"),
        line_chart([Series("a", ((0, None),))], title="t", y_label="y"),
        bar_chart([], title="t", y_label="y"),
    ):
        root = parse(chart)
        assert root.findall(".//svg:circle", NS) == [] and root.findall(".//svg:rect", NS) == []
        assert "No data in this window" in chart


def test_single_point_is_drawn_inside_the_plot():
    root = parse(line_chart([Series("a", ((100, 3.0),))], title="t", y_label="y", width=300))
    (point,) = root.findall(".//svg:circle", NS)
    assert 0 < float(point.get("cx")) < 300


def test_bar_chart_stacks_values_per_group():
    groups = [
        BarGroup("2026-11-29", (("acme", 1.5), ("beta", 0.5))),
        BarGroup("2026-11-30", (("beta", 3.0),)),
    ]
    root = parse(bar_chart(groups, title="cost", y_label="USD"))
    bars = [r for r in root.findall(".//svg:rect", NS) if r.get("class") == "cp-bar"]
    assert [(b.get("data-x"), b.get("data-series"), b.get("data-y")) for b in bars] == [
        ("2026-11-29", "acme", "1.5"),
        ("2026-11-29", "beta", "0.5"),
        ("2026-11-30", "beta", "3"),
    ]
    first, second = bars[0], bars[1]
    # beta sits on top of acme: its bottom edge is acme's top edge.
    assert float(second.get("y")) + float(second.get("height")) == pytest.approx(float(first.get("y")), abs=0.11)
    # Same colour for the same tenant on both days.
    assert bars[1].get("fill") == bars[2].get("fill") != bars[0].get("fill")

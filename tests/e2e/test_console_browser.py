"""The admin's dashboards, roles and audit log in a real headless browser: Debian's chromium driven by
playwright, against the running stack (gunicorn, workers, beat, Triton) after a real batch.

No Django ORM here: users and samples are made through `manage.py` in the stack's own environment, and
the database is read with psycopg (playwright's sync API runs an event loop, where Django refuses ORM calls)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.stack import submit, tensor_lines

pytestmark = [pytest.mark.e2e, pytest.mark.browser]

CHROMIUM = Path("/usr/bin/chromium")
# Headless, no sandbox (tests run as root), and nothing that reaches out of the machine on its own.
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
PASSWORD = "browser-test-pw"
USERS_SCRIPT = f"""
from django.contrib.auth.models import Group, User
for role in ("viewer", "operator"):
    user, _ = User.objects.get_or_create(username=role + "-e2e", defaults={{"is_staff": True}})
    user.set_password("{PASSWORD}")
    user.save()
    user.groups.set([Group.objects.get(name=role)])
"""


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    if not CHROMIUM.exists():
        pytest.skip(f"{CHROMIUM} is absent and scripts/ensure_browser.sh could not install Debian's chromium")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


@pytest.fixture(scope="module")
def users(e2e) -> dict[str, str]:
    # The groups come from the console's migration, which the stack ran.
    e2e.stack.manage("shell", "-c", USERS_SCRIPT)
    return {"viewer": "viewer-e2e", "operator": "operator-e2e"}


def logged_in(browser, e2e, username: str, path: str):
    page = browser.new_context(base_url=e2e.stack.base_url).new_page()
    page.goto(f"/admin/login/?next={path}")
    page.fill("#id_username", username)
    page.fill("#id_password", PASSWORD)
    page.click("input[type=submit]")
    page.wait_for_selector("#user-tools")  # logged in: the admin's header names the user
    return page


def test_dashboards_plot_a_real_run(e2e, browser, users):
    e2e.stack.manage("samples_take")  # the tick before the batch: the next one covers the whole run
    client = e2e.sdk()
    batch = submit(client, tensor_lines(64, prefix="dash"), endpoint="/v2/infer")
    batch = e2e.wait_status(client, batch.id, {"completed", "failed"})
    assert batch.status == "completed", batch.errors
    e2e.stack.manage("samples_take")

    page = logged_in(browser, e2e, users["viewer"], "/admin/")
    page.click("a:text-is('Dashboards')")  # linked from the admin index
    page.wait_for_url(re.compile(r"/admin/console/dashboard/"))
    assert page.locator("h1").inner_text() == "Dashboards"
    for chart in ("queue", "throughput", "slots", "instances"):
        assert page.locator(f"#chart-{chart} svg").count() == 1, chart
        assert page.locator(f"#chart-{chart} .cp-point[data-series='identity']").count() >= 1, chart
    # The batch's 64 lines finished between the two ticks: the identity model's rate is above zero there.
    rates = page.locator("#chart-throughput .cp-point[data-series='identity']")
    assert max(float(rates.nth(i).get_attribute("data-y")) for i in range(rates.count())) > 0
    latency = page.locator("[data-chart^='latency'] svg[aria-label$=': identity']")
    assert latency.count() == 1
    assert latency.locator(".cp-point[data-series='p95']").count() >= 1
    page.click("a[data-window='6h']")
    page.wait_for_url(re.compile(r"window=6h"))
    assert page.locator("a.selected").inner_text() == "6h"
    assert page.locator("#chart-queue .cp-point").count() >= 1
    page.context.close()


def test_viewer_sees_no_action_operator_clicks_one_and_the_audit_log_shows_it(e2e, browser, users):
    e2e.new_tenant("browser-tenant")  # its own tenant: pausing it leaves the other tests' tenant alone
    changelist = "/admin/tenants/tenant/?q=browser-tenant"

    viewer = logged_in(browser, e2e, users["viewer"], changelist)
    assert viewer.locator("#result_list").inner_text().count("browser-tenant") == 1
    assert viewer.locator("select[name=action]").count() == 0  # no action at all for a viewer
    viewer.context.close()

    operator = logged_in(browser, e2e, users["operator"], changelist)
    try:
        operator.check("#result_list input.action-select")
        operator.select_option("select[name=action]", "pause")
        operator.click("button[name=index]")
        assert "Paused: browser-tenant." in operator.locator(".messagelist").inner_text()
        assert e2e.sql("SELECT paused FROM tenants_tenant WHERE name = 'browser-tenant'") == [(True,)]

        operator.goto("/admin/core/auditentry/?action__exact=pause")
        rows = operator.locator("#result_list tbody tr")
        assert rows.count() == 1
        assert "operator-e2e" in rows.first.inner_text() and "tenant" in rows.first.inner_text()
        rows.first.locator("a").first.click()
        # The click returns once navigation starts; wait for the entry's page before reading it.
        operator.wait_for_url(re.compile(r"/admin/core/auditentry/\d+/change/"))
        operator.wait_for_selector("#content-main")
        details = operator.locator("#content-main").inner_text()
        assert "Pause: dispatch no new shards" in details and '"outcome": "done"' in details
    finally:
        # Back to normal, by clicking too (and audited as such).
        operator.goto(changelist)
        operator.check("#result_list input.action-select")
        operator.select_option("select[name=action]", "resume")
        operator.click("button[name=index]")
        operator.wait_for_selector(".messagelist")  # the action's answer: the row is written by then
        operator.context.close()
    assert e2e.sql("SELECT paused FROM tenants_tenant WHERE name = 'browser-tenant'") == [(False,)]
    assert e2e.sql("SELECT action FROM console_auditentry WHERE actor = 'operator-e2e' ORDER BY id") == [
        ("pause",),
        ("resume",),
    ]

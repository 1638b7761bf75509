"""The console in a real browser: Debian's Chromium headless shell, driven by
Playwright, against a real plane and a real console on ephemeral ports.

Every page a test opens is watched: a request to any origin other than the
console's is refused by the browser and fails the test at teardown.
Screenshots of each page go to the test's tmp folder (and, when
``WARDEN_CONSOLE_SCREENSHOTS`` names a folder, there too: ``docs/console/``
is refreshed so).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Browser, BrowserContext, Page, Playwright, Route, sync_playwright

import warden
from tests.conftest import BILLING_TOKEN, Plant
from tests.console.billing import build_billing, write_policies
from warden_server.console import RunningConsole, console_of, start

CHROMIUM = os.environ.get("WARDEN_CHROMIUM", "/usr/bin/chromium-headless-shell")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


@pytest.fixture(scope="module")
def playwright() -> Iterator[Playwright]:
    # Module scope, not session: the sync API keeps an event loop running in
    # this thread while it lives, and a later test's asyncio.run() would fail.
    with sync_playwright() as driver:
        yield driver


@pytest.fixture(scope="module")
def browser(playwright: Playwright) -> Iterator[Browser]:
    if not Path(CHROMIUM).exists():
        pytest.fail(
            f"{CHROMIUM}: no Chromium (`make test` installs Debian's chromium-headless-shell; "
            "or set WARDEN_CHROMIUM)"
        )
    launched = playwright.chromium.launch(
        executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS
    )
    yield launched
    launched.close()


@pytest.fixture
def billing_plant(start_plane: Callable[..., Plant], tmp_path: Path) -> Plant:
    return start_plane(write_policies(tmp_path / "billing-policies"))


@pytest.fixture
def billing(billing_plant: Plant) -> Iterator[warden.Runtime]:
    rt = build_billing(billing_plant.target, BILLING_TOKEN)
    rt.register()
    yield rt
    rt.close()


@pytest.fixture
def start_console(billing_plant: Plant) -> Iterator[Callable[..., RunningConsole]]:
    running: list[RunningConsole] = []

    def launch(**section: Any) -> RunningConsole:
        config = billing_plant.config
        if section:
            config = config.model_copy(
                update={"console": config.console.model_copy(update=section)}
            )
        console = start(config, console_of(config, target=billing_plant.target))
        running.append(console)
        return console

    yield launch
    for console in running:
        console.stop()


@pytest.fixture
def console(start_console: Callable[..., RunningConsole]) -> RunningConsole:
    return start_console()


@dataclass
class Visitor:
    """One person's browser (a context of its own) on the console."""

    context: BrowserContext
    page: Page
    base: str
    shots: Path
    foreign: list[str] = field(default_factory=list)
    """Requests to another origin, refused."""
    seen: list[str] = field(default_factory=list)

    def go(self, path: str) -> Page:
        self.page.goto(self.base + path)
        return self.page

    def sign_in(self, token: str) -> Page:
        page = self.go("/sign-in")
        page.get_by_label("Your actor token (JWT)").fill(token)
        page.get_by_role("button", name="Sign in").click()
        return page

    def shot(self, name: str) -> Path:
        path = self.shots / f"{name}.png"
        self.page.screenshot(path=str(path), full_page=True)
        docs = os.environ.get("WARDEN_CONSOLE_SCREENSHOTS")
        if docs:
            Path(docs).mkdir(parents=True, exist_ok=True)
            shutil.copy(path, Path(docs) / path.name)
        return path

    def csrf(self) -> str:
        return str(self.page.locator("input[name=csrf]").first.input_value())


@pytest.fixture
def visit(browser: Browser, tmp_path: Path) -> Iterator[Callable[[RunningConsole], Visitor]]:
    visitors: list[Visitor] = []
    shots = tmp_path / "screenshots"
    shots.mkdir(exist_ok=True)

    def open_for(console: RunningConsole, **options: Any) -> Visitor:
        context = browser.new_context(
            viewport={"width": 1366, "height": 800}, accept_downloads=True, **options
        )
        visitor = Visitor(context, context.new_page(), console.url, shots)

        def guard(route: Route) -> None:
            url = route.request.url
            visitor.seen.append(url)
            if url == console.url or url.startswith(console.url + "/"):
                route.continue_()
            else:
                visitor.foreign.append(url)
                route.abort()

        context.route("**/*", guard)
        visitors.append(visitor)
        return visitor

    yield open_for
    for visitor in visitors:
        visitor.context.close()
    for visitor in visitors:
        assert visitor.seen, "the guard saw no request: it is not watching"
        assert visitor.foreign == [], f"requests to other origins: {visitor.foreign}"

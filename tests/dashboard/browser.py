"""Headless Chromium through Selenium and Debian's chromedriver; nothing is downloaded."""

from __future__ import annotations

import base64
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
    "--disable-dev-shm-usage",
    "--window-size=1280,900",
    "--hide-scrollbars",
    "--force-device-scale-factor=1",
)


def missing() -> str | None:
    """Why no browser test can run here (None when Chromium and its driver are installed)."""
    for path in (CHROMIUM, CHROMEDRIVER):
        if shutil.which(path) is None:
            return f"{path} is not installed; run .ci/chromium.sh"
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed; pip install -e '.[dev]'"
    return None


@contextmanager
def chromium() -> Iterator[Any]:
    """A fresh Chromium (own profile directory, removed afterwards) driven by Selenium."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    profile = tempfile.mkdtemp(prefix="hai-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (*FLAGS, f"--user-data-dir={profile}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(60)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def wait_until(
    check: Callable[[], Any], timeout: float = 30, what: str = "the condition", fail: bool = True
) -> Any:
    """Poll `check` until it returns something truthy; at the timeout fail, or return the last value."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(0.25)
    if not fail:
        return last
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what} (last: {last!r})")


def screenshot(driver: Any, path: Path, max_bytes: int = 150_000, max_height: int = 1500) -> Path:
    """A PNG of the page (its top `max_height` px), scaled down by Chromium until under `max_bytes`."""
    width, height = driver.execute_script(
        "var e = document.documentElement; return [e.scrollWidth, Math.min(e.scrollHeight, arguments[0])];",
        max_height,
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    for scale in (1.0, 0.85, 0.7, 0.6, 0.5):
        clip = {"x": 0, "y": 0, "width": width, "height": height, "scale": scale}
        shot = driver.execute_cdp_cmd(
            "Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True, "clip": clip}
        )
        data = base64.b64decode(shot["data"])
        path.write_bytes(data)
        if len(data) <= max_bytes:
            break
    return path

"""Airflow 3's Trigger form in headless Chromium: sign in, open the form, fill fields, press Trigger."""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tests.dashboard import browser

ARTIFACTS = Path(__file__).resolve().parents[2] / ".artifacts" / "trigger-form"
"""Where a failed case leaves its screenshot (git ignores it)."""


def sign_in(driver: Any, url: str, user: str, password: str) -> None:
    """Through the auth manager's own login page, as a person would."""
    from selenium.webdriver.common.by import By

    driver.delete_all_cookies()
    driver.get(f"{url}/auth/login")
    username = browser.wait_until(
        lambda: driver.find_elements(By.CSS_SELECTOR, "input[name=username]"), what="the login page"
    )[0]
    username.send_keys(user)
    driver.find_element(By.CSS_SELECTOR, "input[name=password]").send_keys(password)
    driver.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
    browser.wait_until(lambda: "/auth/login" not in driver.current_url, what=f"{user} to be signed in")


class TriggerForm:
    """The Trigger dialog of one DAG, opened from the DAG's page."""

    def __init__(self, driver: Any, url: str, dag_id: str) -> None:
        from selenium.webdriver.common.by import By

        self.driver = driver
        driver.get(f"{url}/dags/{dag_id}")
        browser.wait_until(
            lambda: driver.find_elements(By.CSS_SELECTOR, "[data-testid=trigger-dag-button]"),
            timeout=60,
            what="the Trigger button of the DAG page",
        )[0].click()
        self.submit_button = browser.wait_until(
            lambda: driver.find_elements(By.CSS_SELECTOR, "[data-testid=trigger-dag-submit]"),
            what="the Trigger dialog",
        )[0]
        browser.wait_until(lambda: self._field("task_name"), what="the form's fields")

    def _field(self, name: str) -> Any:
        from selenium.webdriver.common.by import By

        found = self.driver.find_elements(By.CSS_SELECTOR, f"[name=element_{name}]")
        return found[0] if found else None

    def type(self, name: str, text: str) -> None:
        """Replace a text or number field's value with `text` (empty clears it), key by key."""
        from selenium.common.exceptions import StaleElementReferenceException
        from selenium.webdriver.common.keys import Keys

        shown = None
        for _try in range(5):
            # found again each time: a section that opens or a validation may render the field anew
            field = self._field(name)
            assert field is not None, f"no field {name}"
            try:
                self.driver.execute_script("arguments[0].scrollIntoView({block: 'center'})", field)
                field.send_keys(Keys.CONTROL, "a")
                field.send_keys(Keys.DELETE)
                # the form re-renders as it validates, and a fast burst of keys can lose one
                for chunk in (text[i : i + 8] for i in range(0, len(text), 8)):
                    field.send_keys(chunk)
                    time.sleep(0.02)
                has_it = lambda f=field: f.get_attribute("value") == text  # noqa: E731
                typed = browser.wait_until(has_it, 3, name, fail=False)
                if typed:
                    return
                shown = field.get_attribute("value")
            except StaleElementReferenceException:
                continue
        raise AssertionError(f"{name} shows {shown!r} after typing {text!r}")

    def choose(self, name: str, label: str) -> None:
        """Pick the option shown as `label` in a dropdown."""
        from selenium.webdriver.common.by import By
        from selenium.webdriver.common.keys import Keys

        box = self.driver.find_element(By.CSS_SELECTOR, f"#element_{name} input[role=combobox]")
        self.driver.execute_script("arguments[0].scrollIntoView({block: 'center'})", box)
        browser.wait_until(lambda: _clicked(box), timeout=10, what=f"{name} to take a click")
        box.send_keys(label)
        box.send_keys(Keys.ENTER)
        shown = self.driver.find_element(By.CSS_SELECTOR, f"#element_{name}").text
        assert label in shown, f"{name} shows {shown!r}, not {label!r}"

    def open_section(self, title: str) -> None:
        """Open the form section `title` and wait until it shows. Its button and content are found
        again at every look: choosing a mode renders the sections anew, and a click on a button
        that is being replaced is lost (seen on a loaded CI machine)."""
        from selenium.common.exceptions import StaleElementReferenceException
        from selenium.webdriver.common.by import By

        clicked_at = -math.inf

        def opened() -> bool:
            nonlocal clicked_at
            try:
                buttons = [
                    b
                    for b in self.driver.find_elements(By.CSS_SELECTOR, "button[data-part=item-trigger]")
                    if b.text.strip() == title
                ]
                buttons = [b for b in buttons if b.is_displayed()]
                if len(buttons) != 1:
                    return False
                button = buttons[0]
                if button.get_attribute("aria-expanded") == "true":
                    return True
                if time.monotonic() - clicked_at > 3:  # a click not answered in 3 s was lost
                    self.driver.execute_script("arguments[0].scrollIntoView({block: 'center'})", button)
                    button.click()
                    clicked_at = time.monotonic()
                return False
            except StaleElementReferenceException:
                return False

        browser.wait_until(opened, timeout=30, what=f"{title} to open")
        time.sleep(0.5)  # the opening animation

    def value(self, name: str) -> str | None:
        field = self._field(name)
        return None if field is None else field.get_attribute("value")

    def errors(self) -> list[str]:
        """The form's field errors as shown (a field marked invalid, "This field is required"...)."""
        from selenium.webdriver.common.by import By

        return [
            e.text
            for e in self.driver.find_elements(By.CSS_SELECTOR, "[data-part=error-text]")
            if e.text.strip()
        ]

    def can_submit(self) -> bool:
        return bool(self.submit_button.is_enabled()) and self.submit_button.get_attribute("disabled") is None

    def submit(self) -> None:
        errors = self.errors()
        browser.wait_until(self.can_submit, timeout=10, what=f"Trigger to be enabled (errors: {errors})")
        self.submit_button.click()


RENDERS_CJK = r"""
const draw = (text) => {
  const canvas = document.createElement("canvas");
  canvas.width = 64; canvas.height = 32;
  const context = canvas.getContext("2d");
  context.font = "24px sans-serif";
  context.fillText(text, 0, 24);
  return canvas.toDataURL();
};
// a font that lacks a character draws the same empty box for any of them
return draw("\u4efb\u52a1") !== draw("\u{10fffd}\u{10fffd}");
"""


def renders_cjk(driver: Any) -> bool:
    """Whether the browser has a font for Chinese (else the labels show as empty boxes)."""
    return bool(driver.execute_script(RENDERS_CJK))


def _clicked(element: Any) -> bool:
    """Click, or False while something (an opening section) still covers the element."""
    from selenium.common.exceptions import ElementClickInterceptedException

    try:
        element.click()
    except ElementClickInterceptedException:
        return False
    return True


@contextlib.contextmanager
def screenshot_on_failure(driver: Any, case: str) -> Iterator[None]:
    """Keep a picture of the page under .artifacts/ when the block fails, and say where it is."""
    try:
        yield
    except BaseException as failure:
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        path = ARTIFACTS / f"{case}.png"
        with contextlib.suppress(Exception):
            browser.screenshot(driver, path, max_height=3000)
            failure.add_note(f"screenshot of the page: {path}")
        raise

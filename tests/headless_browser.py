"""Headless Chromium (Debian's chromium) for the tests that look at pages as a person would:
``chromium`` runs it once for its output (a page's DOM, a screenshot); ``Browser`` drives it
with selenium through chromedriver (Debian's chromium-driver), itself started through
tests/launching.py, so it and the Chromium it starts end with the test. CI (.ci/run) installs
both and sets SIMPLETUNER_TESTS_REQUIRE_CHROMIUM, so there the browser's tests fail instead of
being skipped."""

from __future__ import annotations

import os
import re
import shutil
import tempfile
import time
import unittest

from launching import Launch, run_bounded

BROWSER_TIMEOUT = 120
REQUIRE_CHROMIUM = "SIMPLETUNER_TESTS_REQUIRE_CHROMIUM"


def _required(program: str, package: str) -> str:
    """The program's path; a skip (a failure where CI requires the browser) without it."""
    found = shutil.which(program)
    if found is None:
        missing = f"{program} is not installed (Debian/Ubuntu: apt-get install -y {package})"
        if os.environ.get(REQUIRE_CHROMIUM):
            raise AssertionError(missing)
        raise unittest.SkipTest(missing)
    return found


def chromium(tmpdir: str, *args: str) -> str:
    """Headless Chromium's stdout for ``args``. CI (.ci/run) installs it and requires it;
    elsewhere the browser's tests are skipped, saying how to install it."""
    browser = _required("chromium", "chromium")
    profile = tempfile.mkdtemp(dir=tmpdir, prefix="chromium-")
    result = run_bounded([browser, "--headless", "--no-sandbox", "--disable-gpu",
                          "--no-first-run", f"--user-data-dir={profile}", *args],
                         tmpdir=tmpdir, timeout=BROWSER_TIMEOUT,
                         env={**os.environ, "HOME": profile})
    if result.returncode != 0:
        raise AssertionError(f"chromium failed ({result.returncode}): {result.stderr[-2000:]}")
    return result.stdout


DRIVER_PORT = re.compile(r"started successfully on port (\d+)")
DRIVER_START_S = 30
WINDOW = "1200,1000"


class Browser:
    """A headless Chromium driven by selenium's WebDriver (``driver``) through chromedriver,
    which this starts on a free port; ``close`` ends the session, then kills what is left."""

    def __init__(self, tmpdir: str):
        try:
            from selenium import webdriver
        except ImportError as exc:  # declared in the ui extra; skipped only outside CI
            if os.environ.get(REQUIRE_CHROMIUM):
                raise
            raise unittest.SkipTest(f"selenium is not installed: {exc}") from None
        browser = _required("chromium", "chromium")
        driver = _required("chromedriver", "chromium-driver")
        profile = tempfile.mkdtemp(dir=tmpdir, prefix="chromium-")
        self.launch = Launch([driver, "--port=0"], tmpdir=tmpdir,
                             env={**os.environ, "HOME": profile})
        options = webdriver.ChromeOptions()
        options.binary_location = browser
        for argument in ("--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                         f"--window-size={WINDOW}", f"--user-data-dir={profile}"):
            options.add_argument(argument)
        try:
            self.driver = webdriver.Remote(f"http://127.0.0.1:{self._port()}", options=options)
        except BaseException:
            self.launch.close()
            raise

    def _port(self) -> int:
        deadline = time.monotonic() + DRIVER_START_S
        while time.monotonic() < deadline:
            found = DRIVER_PORT.search(self.launch.stdout())
            if found:
                return int(found.group(1))
            if self.launch.process.poll() is not None:
                break
            time.sleep(0.1)
        self.launch.close()
        raise AssertionError(f"chromedriver did not start:\n{self.launch.stdout()[-2000:]}"
                             f"\n{self.launch.stderr()[-2000:]}")

    def wait_for(self, condition, timeout: float, what: str):
        """``condition(driver)``'s first true value, polled; a failure naming ``what``."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = condition(self.driver)
            if value:
                return value
            time.sleep(0.2)
        raise AssertionError(f"not {what} within {timeout:.0f} s; the page's text:\n"
                             f"{self.driver.find_element('tag name', 'body').text[-3000:]}")

    def close(self) -> None:
        try:
            self.driver.quit()
        finally:
            self.launch.close()

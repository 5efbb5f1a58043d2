"""Headless Chromium (Debian's chromium) for the tests that look at pages as a person would.
CI (.ci/run) installs it and sets SIMPLETUNER_TESTS_REQUIRE_CHROMIUM, so there the browser's
tests fail instead of being skipped."""

from __future__ import annotations

import os
import shutil
import tempfile
import unittest

from launching import run_bounded

BROWSER_TIMEOUT = 120
REQUIRE_CHROMIUM = "SIMPLETUNER_TESTS_REQUIRE_CHROMIUM"


def chromium(tmpdir: str, *args: str) -> str:
    """Headless Chromium's stdout for ``args``. CI (.ci/run) installs it and requires it;
    elsewhere the browser's tests are skipped, saying how to install it."""
    browser = shutil.which("chromium")
    if browser is None:
        missing = "chromium is not installed (Debian/Ubuntu: apt-get install -y chromium)"
        if os.environ.get(REQUIRE_CHROMIUM):
            raise AssertionError(missing)
        raise unittest.SkipTest(missing)
    profile = tempfile.mkdtemp(dir=tmpdir, prefix="chromium-")
    result = run_bounded([browser, "--headless", "--no-sandbox", "--disable-gpu",
                          "--no-first-run", f"--user-data-dir={profile}", *args],
                         tmpdir=tmpdir, timeout=BROWSER_TIMEOUT,
                         env={**os.environ, "HOME": profile})
    if result.returncode != 0:
        raise AssertionError(f"chromium failed ({result.returncode}): {result.stderr[-2000:]}")
    return result.stdout

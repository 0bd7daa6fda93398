"""A real headless browser for the console's tests and bin/console-screenshots: Debian's
chromium driven by chromium-driver through selenium (both installed by ``bin/test`` with
``ensure_chromium``). Nothing is downloaded: the browser and the driver are given by path,
so selenium's own driver manager never runs."""
from __future__ import annotations

import contextlib
import shutil
import tempfile

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run", "--window-size=1280,900")


@contextlib.contextmanager
def headless_chromium(*flags: str):
    """A selenium WebDriver on a fresh, empty profile (with ``flags`` besides FLAGS); quit
    and removed afterwards."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    profile = tempfile.mkdtemp(prefix="odradek-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in FLAGS + flags:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={profile}")
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(60)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)

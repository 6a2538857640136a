"""Headless Chromium for the UI tests. A missing browser is a failure, never a skip: CI installs it."""

from __future__ import annotations

import os
import shutil

import pytest

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--window-size=1400,1800",
)


def _find(*names: str) -> str | None:
    for n in names:
        path = shutil.which(n) or (n if os.path.exists(n) else None)
        if path:
            return path
    return None


@pytest.fixture(scope="session")
def browser():
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        pytest.fail("selenium is not installed: pip install selenium (it is in the project's ui extra)")
    chromium = _find("/usr/bin/chromium", "chromium", "chromium-browser")
    driver_path = _find("/usr/bin/chromedriver", "chromedriver")
    if not chromium or not driver_path:
        pytest.fail("headless Chromium is required for the UI test: apt-get install -y chromium chromium-driver")
    opts = webdriver.ChromeOptions()
    opts.binary_location = chromium
    for flag in CHROMIUM_FLAGS:
        opts.add_argument(flag)
    # Explicit driver and binary: Selenium Manager never runs, so nothing is downloaded.
    driver = webdriver.Chrome(service=Service(executable_path=driver_path), options=opts)
    driver.set_page_load_timeout(60)
    yield driver
    driver.quit()


for _k, _v in (("OMP_NUM_THREADS", "1"), ("HF_HUB_OFFLINE", "1"), ("TRANSFORMERS_OFFLINE", "1"), ("TRL_EXPERIMENTAL_SILENCE", "1")):
    os.environ.setdefault(_k, _v)

from tests.fixtures_models import tiny_qwen3vl_dir  # noqa: F401  (session fixture)


@pytest.fixture(scope="session")
def grpo_dump(tmp_path_factory, tiny_qwen3vl_dir):  # noqa: F811  (the fixture above)
    """The `trajectories/` dump of one real tiny GRPO step (one group of 4 rollouts; see grpo_dump.py)."""
    from tests.ui.grpo_dump import run_tiny_grpo

    return run_tiny_grpo(tmp_path_factory.mktemp("grpo_dump"), tiny_qwen3vl_dir)

"""The Rollouts and Paint tabs in headless Chromium: a real tiny GRPO dump, and EASEL painting."""

from __future__ import annotations

import pytest

from canvasagent.ui.controller import UIConfig
from tests.stub_openai import free_port
from tests.ui.test_ui_browser import _wait


@pytest.fixture
def viewer_app(tmp_path, grpo_dump):
    from canvasagent.ui.app import launch

    port = free_port()
    demo = launch(UIConfig(runs_dir=str(tmp_path / "runs"), rollouts=str(grpo_dump)), port=port, block=False)
    yield f"http://127.0.0.1:{port}/", grpo_dump
    demo.close()


def _pick(browser, elem_id, value):
    from selenium.webdriver.common.by import By

    browser.find_element(By.CSS_SELECTOR, f"#{elem_id} input").click()
    _wait(lambda: browser.find_element(By.CSS_SELECTOR, f"#{elem_id} li[data-testid=dropdown-option][aria-label='{value}']"), what=f"option {value}").click()


def test_rollout_viewer_on_a_real_grpo_dump(viewer_app, browser, tmp_path):
    from selenium.webdriver.common.by import By

    from canvasagent.ui import rollouts as R

    url, dump = viewer_app
    rs = R.load(dump)
    best, worst = R.select(rs)[0], R.select(rs)[-1]
    browser.get(url)
    info = _wait(lambda: (t := browser.find_element(By.ID, "rollout-info").text) and "4 rollouts" in t and t, what="the dump to load")
    assert "grpo" in info and "1 group(s)" in info
    # Two rollouts of the group side by side: the best as A, the worst as B.
    side_a = _wait(lambda: (t := browser.find_element(By.ID, "side-a").text) and best.key in t and t, what="rollout A")
    side_b = _wait(lambda: (t := browser.find_element(By.ID, "side-b").text) and worst.key in t and t, what="rollout B")
    assert "advantage +" in side_a and "rule" in side_a and "Flip" in side_a and "tool errors" not in side_a
    assert "advantage -" in side_b and "tool errors" in side_b and "img_9" in side_b
    _wait(lambda: len(browser.find_element(By.ID, "images-a").find_elements(By.TAG_NAME, "img")) >= 2, what="A's input and Flip_0")
    _wait(lambda: len(browser.find_element(By.ID, "images-b").find_elements(By.TAG_NAME, "img")) >= 1, what="B's input")
    table = browser.find_element(By.ID, "rollout-table")
    assert all(r.key in table.text for r in rs.rollouts)
    assert table.text.index(best.key) < table.text.index(worst.key)  # sorted by reward, best first
    browser.save_screenshot(str(tmp_path / "viewer.png"))

    # Filter: only rollouts with tool errors; then sort by reward, lowest first.
    browser.find_element(By.CSS_SELECTOR, "#rollout-errors input").click()
    errs = {r.key for r in rs.rollouts if r.errors}
    _wait(lambda: all(r.key not in browser.find_element(By.ID, "rollout-table").text for r in rs.rollouts if not r.errors), what="the error filter")
    assert all(k in browser.find_element(By.ID, "rollout-table").text for k in errs)
    browser.find_element(By.CSS_SELECTOR, "#rollout-errors input").click()
    _pick(browser, "rollout-sort", "reward ↑")
    _wait(lambda: (t := browser.find_element(By.ID, "rollout-table").text) and best.key in t and t.index(worst.key) < t.index(best.key), what="ascending sort")
    # Browse step -> group, then keep only rewards above the midpoint.
    _pick(browser, "rollout-step", best.step)
    _pick(browser, "rollout-group", best.group)
    browser.find_element(By.CSS_SELECTOR, "#rollout-min textarea, #rollout-min input").send_keys(f"{(best.reward + worst.reward) / 2:.4f}")
    keep = {r.key for r in rs.rollouts if r.reward >= (best.reward + worst.reward) / 2}
    _wait(lambda: (t := browser.find_element(By.ID, "rollout-table").text) and all(k in t for k in keep)
          and not any(r.key in t for r in rs.rollouts if r.key not in keep), what="the min-reward filter")


def test_paint_tab_stroke_undo_submit(tmp_path, browser):
    from selenium.webdriver.common.by import By

    from canvasagent.ui.app import launch

    port = free_port()
    demo = launch(UIConfig(runs_dir=str(tmp_path / "runs")), port=port, block=False)
    try:
        browser.get(f"http://127.0.0.1:{port}/")
        _wait(lambda: browser.find_element(By.XPATH, "//button[@role='tab' and contains(., 'Paint')]"), what="the Paint tab").click()
        budget = _wait(lambda: browser.find_element(By.CSS_SELECTOR, "#paint-budget input"), what="the budget box")
        budget.clear()
        budget.send_keys("3")
        browser.find_element(By.ID, "paint-start").click()
        status = lambda: browser.find_element(By.CSS_SELECTOR, "#paint-status textarea").get_attribute("value")
        _wait(lambda: "step 0/3" in status(), what="the painting to start")
        browser.find_element(By.ID, "paint-go").click()
        _wait(lambda: "step 1/3" in status() and "1 stroke(s)" in status(), what="one stroke")
        s1 = float(status().split("S=")[1].split()[0])
        blank = float(status().split("blank ")[1].split(")")[0])
        assert s1 != blank  # S is shown after the stroke, and it moved
        _wait(lambda: browser.find_element(By.ID, "paint-canvas").find_elements(By.TAG_NAME, "img"), what="the canvas image")
        _wait(lambda: browser.find_element(By.ID, "paint-curve").find_elements(By.TAG_NAME, "img"), what="the S curve")
        box = browser.find_element(By.CSS_SELECTOR, "#paint-stroke textarea")
        box.clear()
        box.send_keys("{typo")
        browser.find_element(By.ID, "paint-go").click()
        _wait(lambda: "not valid JSON" in status(), what="the typo refused")
        browser.find_element(By.ID, "paint-undo").click()
        _wait(lambda: "step 2/3" in status() and "0 stroke(s)" in status(), what="the undo")
        browser.find_element(By.ID, "paint-submit").click()
        _wait(lambda: "submitted" in status(), what="the submit")
        (d,) = (tmp_path / "runs").glob("paint-*")
        assert (d / "canvas.png").exists() and len((d / "strokes.jsonl").read_text().splitlines()) == 3
    finally:
        demo.close()

"""The web UI end to end in headless Chromium: upload, run a replay session, see the assets."""

from __future__ import annotations

import json
import time

import pytest
from PIL import Image

from canvasagent.core.protocol import format_reply
from canvasagent.core.trajectory import Trajectory
from canvasagent.ui.controller import UIConfig
from tests.stub_openai import free_port

REPLIES = [
    format_reply("Mirror the photo.", {"name": "Flip", "arguments": {"image": "img_1"}}),
    format_reply("Keep the left half.", {"name": "Crop", "arguments": {"image": "Flip_0", "bbox": [0, 0, 500, 1000]}}),
    format_reply("Done.", terminate=True),
]


@pytest.fixture
def app(tmp_path):
    from canvasagent.ui.app import launch

    replay = tmp_path / "replies.json"
    replay.write_text(json.dumps(REPLIES))
    cfg = UIConfig(policy=f"replay:{replay}", runs_dir=str(tmp_path / "runs"))
    port = free_port()
    demo = launch(cfg, port=port, block=False)
    yield f"http://127.0.0.1:{port}/", tmp_path / "runs"
    demo.close()


def _wait(pred, timeout=30.0, what="condition"):
    t0 = time.time()
    while time.time() - t0 < timeout:
        try:
            value = pred()
            if value:
                return value
        except Exception:  # the page is still rendering
            pass
        time.sleep(0.25)
    raise AssertionError(f"timed out waiting for {what}")


def test_upload_run_replay_and_gallery(app, browser, tmp_path):
    from selenium.webdriver.common.by import By

    url, runs = app
    img = tmp_path / "photo.png"
    Image.new("RGB", (64, 40), (200, 30, 30)).save(img)

    browser.get(url)
    _wait(lambda: browser.find_element(By.CSS_SELECTOR, "#uploads input[type=file]"), what="the upload input")
    browser.find_element(By.CSS_SELECTOR, "#uploads input[type=file]").send_keys(str(img))
    _wait(lambda: "photo" in browser.find_element(By.ID, "uploads").text, what="the upload to finish")
    browser.find_element(By.CSS_SELECTOR, "#instruction textarea").send_keys("Mirror it and keep the left half")
    browser.find_element(By.ID, "start").click()
    _wait(lambda: "img_1" in browser.find_element(By.CSS_SELECTOR, "#asset-ids textarea").get_attribute("value"), what="the session to start")
    browser.find_element(By.ID, "run").click()
    ids = _wait(
        lambda: (v := browser.find_element(By.CSS_SELECTOR, "#asset-ids textarea").get_attribute("value")) and "Crop_0" in v and v,
        what="the replay to produce Crop_0",
    )
    assert ids.split() == ["img_1", "Flip_0", "Crop_0"]
    gallery = browser.find_element(By.ID, "asset-gallery")
    _wait(lambda: len(gallery.find_elements(By.TAG_NAME, "img")) >= 3, what="three gallery images")
    _wait(lambda: "finished" in browser.find_element(By.CSS_SELECTOR, "#status textarea").get_attribute("value"), what="status")
    # The transcript reads like a conversation: the task, then reason + call, observation + image.
    chat = _wait(lambda: (el := browser.find_element(By.ID, "transcript")) and "session finished" in el.text and el, what="the transcript")
    text = chat.text
    assert "Task" in text and "Mirror it and keep the left half" in text
    assert "reason: Mirror the photo." in text and 'Flip {"image": "img_1"}' in text and "Crop_0" in text
    assert text.index("Mirror the photo.") < text.index("Keep the left half.") < text.index("session finished")
    _wait(lambda: len(chat.find_elements(By.TAG_NAME, "img")) >= 3, what="input, Flip_0 and Crop_0 in the transcript")
    for group in ("run-controls", "step-controls", "hitl-controls"):
        assert browser.find_element(By.ID, group).is_displayed()
    downloads = browser.find_element(By.ID, "downloads").text
    assert "trajectory-" in downloads and "Crop_0" in downloads
    browser.save_screenshot(str(tmp_path / "ui.png"))

    # Roll back to Flip_0 from the page: later assets disappear from the gallery and the imglist.
    box = browser.find_element(By.CSS_SELECTOR, "#rollback-target input")
    box.click()
    option = _wait(lambda: browser.find_element(By.CSS_SELECTOR, "#rollback-target li[data-testid=dropdown-option][aria-label='Flip_0']"), what="the Flip_0 option")
    option.click()
    browser.find_element(By.ID, "rollback").click()
    _wait(lambda: browser.find_element(By.CSS_SELECTOR, "#asset-ids textarea").get_attribute("value").split() == ["img_1", "Flip_0"], what="the rollback")
    _wait(lambda: len(browser.find_element(By.ID, "asset-gallery").find_elements(By.TAG_NAME, "img")) == 2, what="two gallery images")
    _wait(lambda: "Crop_0" not in browser.find_element(By.ID, "transcript").text, what="the transcript to rewind")

    (session_dir,) = list(runs.iterdir())
    traj = Trajectory.load(session_dir)
    assert traj.tool_sequence == ["Flip"] and traj.assets.ids() == ["img_1", "Flip_0"]
    assert traj.meta["rollbacks"] == [{"to": "Flip_0", "dropped_turns": 2}]
    final = sorted((session_dir / "export").glob("final-*Crop_0.png"))
    assert final and Image.open(final[0]).size == (32, 40)  # the download made before the rollback


def test_closing_the_tab_mid_episode_ends_and_keeps_the_session(app, browser, tmp_path):
    from selenium.webdriver.common.by import By

    url, runs = app
    img = tmp_path / "photo.png"
    Image.new("RGB", (64, 40), (30, 30, 200)).save(img)
    first = browser.current_window_handle
    browser.switch_to.new_window("tab")
    browser.get(url)
    _wait(lambda: browser.find_element(By.CSS_SELECTOR, "#uploads input[type=file]"), what="the upload input")
    browser.find_element(By.CSS_SELECTOR, "#uploads input[type=file]").send_keys(str(img))
    _wait(lambda: "photo" in browser.find_element(By.ID, "uploads").text, what="the upload to finish")
    browser.find_element(By.ID, "start").click()
    _wait(lambda: "img_1" in browser.find_element(By.CSS_SELECTOR, "#asset-ids textarea").get_attribute("value"), what="the session to start")
    browser.find_element(By.ID, "step").click()
    _wait(lambda: "Flip_0" in browser.find_element(By.CSS_SELECTOR, "#asset-ids textarea").get_attribute("value"), what="one step")
    browser.close()  # the user closes the tab mid-episode
    browser.switch_to.window(first)
    (session_dir,) = list(runs.iterdir())
    traj = _wait(lambda: (t := Trajectory.load(session_dir)).stop_reason == "user_closed" and t, timeout=30, what="the session to end")
    assert traj.tool_sequence == ["Flip"] and traj.assets.ids() == ["img_1", "Flip_0"]


def test_offline_example_fills_the_form_and_runs(app, browser):
    from selenium.webdriver.common.by import By

    from canvasagent.ui.controller import EXAMPLES

    url, _ = app
    ex = next(e for e in EXAMPLES if e.command)  # one the user drives with a take-over command
    browser.get(url)
    box = _wait(lambda: browser.find_element(By.CSS_SELECTOR, "#example input"), what="the example picker")
    box.click()
    _wait(lambda: browser.find_element(By.CSS_SELECTOR, f"#example li[data-testid=dropdown-option][aria-label='{ex.label}']"), what="the example").click()
    browser.find_element(By.ID, "use-example").click()
    _wait(lambda: ex.sample in browser.find_element(By.ID, "uploads").text, what="the example photo")
    assert browser.find_element(By.CSS_SELECTOR, "#instruction textarea").get_attribute("value") == ex.instruction
    _wait(lambda: browser.find_element(By.CSS_SELECTOR, "#command textarea").get_attribute("value") == ex.command, what="the command")
    browser.find_element(By.ID, "start").click()
    _wait(lambda: "img_1" in browser.find_element(By.CSS_SELECTOR, "#asset-ids textarea").get_attribute("value"), what="the session to start")
    browser.find_element(By.ID, "execute").click()
    _wait(lambda: browser.find_element(By.CSS_SELECTOR, "#asset-ids textarea").get_attribute("value").split()[-1] == f"{ex.command.split()[0]}_0",
          what="the example's call to run")
    assert "you took over" in browser.find_element(By.ID, "transcript").text

"""A multi-step public-format (ShareGPT) trajectory replays with the same IDs, echoes and pixels.

The recorded tool turns below were written by hand from the public tools' documented behaviour
(shared/docs/reference.md), and the recorded images are computed with numpy, not with our tools.
"""

import json

import numpy as np
from PIL import Image

from canvasagent.cli import main
from toolserver.client import make_toolbox
from canvasagent.core.formats.sharegpt import iter_records, read_record
from canvasagent.replay import from_public, replay
from tests.core.conftest import gradient


def reply(reason, name=None, args=None, terminate=False):
    s = f"<reason>{reason}</reason>"
    if name:
        s += "<tool_call>" + json.dumps({"name": name, "arguments": args}) + "</tool_call>"
    if terminate:
        s += "<Terminate>"
    return s


def make_record(tmp_path):
    img1 = gradient(200, 100)
    a1 = np.asarray(img1)
    star = np.zeros((10, 20, 4), np.uint8)
    star[..., 1] = 180
    star[2:8, 4:16, 3] = 255
    img2 = Image.fromarray(star, "RGBA")

    crop = a1[25:50, 50:100]  # bbox [250,250,500,500] on 200x100
    flip = crop[:, ::-1]
    rot = flip[::-1, ::-1]
    over = a1.copy()
    # position [500, 500] -> (100, 50); paste top-left (100-10, 50-5) = (90, 45); opaque where alpha=255
    region = over[45:55, 90:110]
    region[star[..., 3] == 255] = (0, 180, 0)

    files = {
        "in1.png": img1,
        "in2.png": img2,
        "sam.png": Image.fromarray(((np.arange(200)[None, :] > 100) & (np.arange(100)[:, None] > 10)).astype(np.uint8) * 255, "L"),
        "crop.png": Image.fromarray(crop),
        "flip.png": Image.fromarray(flip),
        "rot.png": Image.fromarray(rot),
        "over.png": Image.fromarray(over),
    }
    for name, im in files.items():
        im.save(tmp_path / name)

    L = "{img_1, img_2"
    msgs = [
        {"role": "system", "content": "You are a visual agent."},
        {"role": "user", "content": "<image><image>Find the box, cut it out, mirror it, turn it and add the star."},
        {"role": "assistant", "content": reply("Locate the region.", "Grounding", {"image": "img_1", "reference_text": "box"})},
        {"role": "tool", "content": "Found 1 objects:\n  - 'box': [250, 250, 500, 500] (confidence: 0.91)\n\n[now imglist is {img_1, img_2}]"},
        {"role": "assistant", "content": reply("Mask it.", "SAM", {"image": "img_1", "bbox": "[250, 250, 500, 500]"})},
        {"role": "tool", "content": f"<image>Generated segmentation mask.\n[Output image saved as: SAM_0. now imglist is {L}, SAM_0}}]"},
        {"role": "assistant", "content": reply("Crop.", "Crop", {"image": "img_1", "bbox": "[250, 250, 500, 500]"})},
        {"role": "tool", "content": f"<image>Cropped image with bounding box: [50,25,100,50]\n[Output image saved as: Crop_0. now imglist is {L}, SAM_0, Crop_0}}]"},
        {"role": "assistant", "content": reply("A bad reference.", "Flip", {"image": "Crop_7"})},
        {"role": "tool", "content": "Error: unknown image\n[now imglist is {img_1, img_2, SAM_0, Crop_0}]"},
        {"role": "assistant", "content": reply("Mirror.", "Flip", {"image": "Crop_0"})},
        {"role": "tool", "content": f"<image>Flipped image horizontally\n[Output image saved as: Flip_0. now imglist is {L}, SAM_0, Crop_0, Flip_0}}]"},
        {"role": "assistant", "content": reply("Turn.", "Rotate", {"image": "Flip_0", "angle": 180})},
        {"role": "tool", "content": f"<image>Rotated image by 180 degrees\n[Output image saved as: Rotate_0. now imglist is {L}, SAM_0, Crop_0, Flip_0, Rotate_0}}]"},
        {"role": "assistant", "content": reply("Star.", "Overlayer", {"base_image": "img_1", "overlay_type": "object", "content": "img_2"})},
        {"role": "tool", "content": f"<image>Overlaid object onto image at position [500,500]. Output size: (200, 100)\n[Output image saved as: Overlayer_0. now imglist is {L}, SAM_0, Crop_0, Flip_0, Rotate_0, Overlayer_0}}]"},
        {"role": "assistant", "content": reply("Done.", terminate=True)},
    ]
    record = {"messages": msgs, "images": ["in1.png", "in2.png", "sam.png", "crop.png", "flip.png", "rot.png", "over.png"]}
    path = tmp_path / "record.json"
    path.write_text(json.dumps(record))
    return path, files


def test_public_record_replays_ids_echoes_and_pixels(tmp_path):
    path, files = make_record(tmp_path)
    pt = read_record(next(iter_records(path)), base_dir=tmp_path)
    assert pt.task.images[1].mode == "RGBA"  # no mode conversion on load
    traj, report = replay(from_public(pt), make_toolbox("offline"))
    assert traj.assets.get("img_2").image.mode == "RGBA"
    assert traj.assets.ids() == ["img_1", "img_2", "SAM_0", "Crop_0", "Flip_0", "Rotate_0", "Overlayer_0"]
    steps = report["steps"]
    assert [s["status"] for s in steps] == ["ok", "ok", "ok", "error", "ok", "ok", "ok", "terminate"]
    assert steps[3]["error_code"] == "unknown_asset"
    for s in steps[:-1]:
        if s["status"] == "ok":
            assert s["echo_match"], s
    assert report["summary"]["pixel_matches"] == "5/5"
    for aid, fname in [("Crop_0", "crop.png"), ("Flip_0", "flip.png"), ("Rotate_0", "rot.png"), ("Overlayer_0", "over.png")]:
        np.testing.assert_array_equal(np.asarray(traj.assets.get(aid).image), np.asarray(files[fname]))


def test_replay_cli_writes_report_and_assets(tmp_path, capsys):
    path, _ = make_record(tmp_path)
    out = tmp_path / "out"
    assert main(["replay", str(path), "--out", str(out)]) == 0
    report = json.loads((out / "report.json").read_text())
    assert report["final_asset_id"] == "Overlayer_0"
    assert {"tool", "arguments", "status", "error", "output_id", "imglist"} <= set(report["steps"][0])
    for aid in report["imglist"]:
        assert (out / f"{aid}.png").exists()
    assert Image.open(out / "img_2.png").mode == "RGBA"
    # Our own trajectory format replays too.
    assert main(["replay", str(out / "trajectory"), "--out", str(tmp_path / "again")]) == 0
    again = json.loads((tmp_path / "again" / "report.json").read_text())
    assert again["imglist"] == report["imglist"]
    assert again["summary"]["pixel_matches"] == "5/5"


def test_replay_input_overrides_and_bad_files(tmp_path, capsys):
    path, _ = make_record(tmp_path)
    assert main(["replay", str(path), "--image", f"img_1={tmp_path / 'in1.png'}", "--out", str(tmp_path / "o")]) == 2
    assert "give all of them" in capsys.readouterr().err
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    assert main(["replay", str(bad), "--out", str(tmp_path / "o2")]) == 2
    rec = json.loads(path.read_text())
    rec["images"][0] = "../../../../etc/passwd"
    esc = tmp_path / "esc.json"
    esc.write_text(json.dumps(rec))
    assert main(["replay", str(esc), "--out", str(tmp_path / "o3")]) == 2

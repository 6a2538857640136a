"""Every pure tool, in both profiles, against pixels computed by hand with numpy."""

import numpy as np
import pytest
from PIL import Image

from canvasagent.core.episode import Episode, EpisodeConfig
from canvasagent.core.tasks import Task
from tests.core.conftest import gradient
from toolserver.fonts import dejavu_sans
from toolserver.validation import Profile


def run(toolbox, images, name, args):
    ep = Episode(toolbox, EpisodeConfig(max_turns=5))
    ep.reset(Task("t", images))
    res = ep.call_tool(name, args)
    return ep, res.turn


def arr(img):
    return np.asarray(img)


# -- Crop ----------------------------------------------------------------------------------------


def test_crop_canvascraft_truncates_before_scaling(cc_toolbox, grad):
    # 120.7 -> 120 -> floor(120*200/1000) = 24; 333.9 -> 333 -> floor(333*100/1000) = 33
    ep, turn = run(cc_toolbox, [grad], "Crop", {"image": "img_1", "bbox": "[120.7, 333.9, 640, 1500]"})
    assert turn.status == "ok", turn.error
    out = ep.assets.get("Crop_0").image
    # 640*200/1000 = 128; 1500 is clamped to 1000 -> 100
    np.testing.assert_array_equal(arr(out), arr(grad)[33:100, 24:128])
    assert turn.observation.startswith("Cropped image with bounding box: [24,33,128,100]\n[Output image saved as: Crop_0.")


def test_crop_exact_uses_floor_ceil_and_refuses_over_1000(exact_toolbox, grad):
    ep, turn = run(exact_toolbox, [grad], "Crop", {"image": "img_1", "bbox": [120.7, 333.9, 640.1, 999]})
    assert turn.status == "ok"
    # floor(120.7*0.2)=24, floor(33.39)=33, ceil(128.02)=129, ceil(99.9)=100
    np.testing.assert_array_equal(arr(ep.assets.get("Crop_0").image), arr(grad)[33:100, 24:129])
    _, bad = run(exact_toolbox, [grad], "Crop", {"image": "img_1", "bbox": [0, 0, 1500, 10]})
    assert bad.status == "error" and bad.error_code == "bbox_out_of_range"


def test_crop_drops_alpha_only_in_canvascraft():
    rgba = Image.new("RGBA", (10, 10), (10, 20, 30, 40))
    for profile, mode in ((Profile.CANVASCRAFT, "RGB"), (Profile.EXACT, "RGBA")):
        from toolserver.toolbox import LocalToolbox

        ep, turn = run(LocalToolbox(profile=profile), [rgba], "Crop", {"image": "img_1", "bbox": [0, 0, 500, 500]})
        out = ep.assets.get("Crop_0").image
        assert out.mode == mode and out.size == (5, 5)
        assert arr(out)[0, 0, :3].tolist() == [10, 20, 30]  # no compositing onto white


@pytest.mark.parametrize(
    "bbox,code",
    [
        ([500, 0, 400, 100], "bbox_unordered"),
        ([-1, 0, 400, 100], "bbox_out_of_range"),
        ("[1, 2, 3]", "bbox_format"),
        ("left half", "bbox_format"),
        ([0, 0, float("nan"), 5], "not_finite"),
        ([0, 0, 1e300, 5], "number_too_large"),
    ],
)
def test_crop_bad_bbox_is_an_error_observation(toolbox, grad, bbox, code):
    ep, turn = run(toolbox, [grad], "Crop", {"image": "img_1", "bbox": bbox})
    assert turn.status == "error"
    assert turn.error_code == code, turn.error
    assert ep.assets.ids() == ["img_1"]
    assert turn.observation.startswith("Error: ") and turn.observation.endswith("[now imglist is {img_1}]")


def test_crop_sub_unit_boxes(cc_toolbox, exact_toolbox, grad):
    # canvascraft truncates 0.2/0.9 to 0 before scaling, so the box collapses.
    _, turn = run(cc_toolbox, [grad], "Crop", {"image": "img_1", "bbox": [0.2, 0.2, 0.9, 0.9]})
    assert turn.error_code == "bbox_unordered"
    # [1,1,2,2] survives truncation but floor(1*200/1000) == floor(2*200/1000) == 0: no pixels.
    _, turn = run(cc_toolbox, [grad], "Crop", {"image": "img_1", "bbox": [1, 1, 2, 2]})
    assert turn.error_code == "empty_crop"
    # exact: floor(0.04)=0 and ceil(0.18)=1, a one-pixel crop.
    ep, turn = run(exact_toolbox, [grad], "Crop", {"image": "img_1", "bbox": [0.2, 0.2, 0.9, 0.9]})
    assert turn.status == "ok" and ep.assets.get("Crop_0").image.size == (1, 1)


# -- Rotate --------------------------------------------------------------------------------------


def test_rotate_180_both_profiles(toolbox, grad):
    ep, turn = run(toolbox, [grad], "Rotate", {"image": "img_1", "angle": 180})
    assert turn.status == "ok"
    np.testing.assert_array_equal(arr(ep.assets.get("Rotate_0").image), arr(grad)[::-1, ::-1])
    assert turn.observation.startswith("Rotated image by 180 degrees")


def test_rotate_90_canvascraft_is_counter_clockwise_without_expand(cc_toolbox):
    img = gradient(60, 40)
    ep, turn = run(cc_toolbox, [img], "Rotate", {"image": "img_1", "angle": "90"})
    out = arr(ep.assets.get("Rotate_0").image)
    assert out.shape == (40, 60, 3)  # keeps W x H
    # Overhang is cut and the 10-px strips left and right are white fill.
    assert (out[:, :10] == 255).all() and (out[:, 50:] == 255).all()
    # Centre 40x40 window equals the counter-clockwise turn of the source's centre window.
    np.testing.assert_array_equal(out[:, 10:50], np.rot90(arr(img)[:, 10:50], k=1))


def test_rotate_90_exact_is_clockwise_lossless_and_expands(exact_toolbox):
    img = gradient(60, 40)
    ep, _ = run(exact_toolbox, [img], "Rotate", {"image": "img_1", "angle": 90})
    out = arr(ep.assets.get("Rotate_0").image)
    assert out.shape == (60, 40, 3)
    np.testing.assert_array_equal(out, np.rot90(arr(img), k=-1))


def test_rotate_45_expands_to_rotated_bounding_box(toolbox):
    img = Image.new("RGB", (100, 50), (0, 0, 0))
    ep, _ = run(toolbox, [img], "Rotate", {"image": "img_1", "angle": 45})
    out = ep.assets.get("Rotate_0").image
    side = (100 + 50) / 2**0.5  # 106.07
    # PIL rounds the rotated corners outward to whole pixels, adding up to 2 px.
    assert 0 <= out.width - side <= 2 and 0 <= out.height - side <= 2
    assert arr(out)[0, 0].tolist() == [255, 255, 255]  # corners are white fill
    assert arr(out)[out.height // 2, out.width // 2].tolist() == [0, 0, 0]


def test_rotate_bad_angle(toolbox, grad):
    ep, turn = run(toolbox, [grad], "Rotate", {"image": "img_1", "angle": 30})
    assert turn.status == "error" and turn.error_code == "bad_choice"


# -- Flip ----------------------------------------------------------------------------------------


def test_flip(toolbox, grad):
    ep, turn = run(toolbox, [grad], "Flip", {"image": "img_1"})
    np.testing.assert_array_equal(arr(ep.assets.get("Flip_0").image), arr(grad)[:, ::-1])
    assert turn.observation == "Flipped image horizontally\n[Output image saved as: Flip_0. now imglist is {img_1, Flip_0}]"


def test_flip_keeps_alpha_only_in_exact():
    rgba = Image.new("RGBA", (4, 3), (1, 2, 3, 4))
    from toolserver.toolbox import LocalToolbox

    ep, _ = run(LocalToolbox(profile=Profile.EXACT), [rgba], "Flip", {"image": "img_1"})
    assert ep.assets.get("Flip_0").image.mode == "RGBA" and ep.assets.get("Flip_0").kind.value == "rgba"
    ep, _ = run(LocalToolbox(profile=Profile.CANVASCRAFT), [rgba], "Flip", {"image": "img_1"})
    assert ep.assets.get("Flip_0").image.mode == "RGB"


# -- Extract -------------------------------------------------------------------------------------


def test_extract_cuts_to_mask_bbox_with_alpha(toolbox, grad):
    mask = np.zeros((100, 200), np.uint8)
    mask[20:40, 50:90] = 255
    mask[25, 60] = 0  # a hole stays transparent
    ep, turn = run(toolbox, [grad, Image.fromarray(mask, "L")], "Extract", {"image": "img_1", "mask": "img_2"})
    assert turn.status == "ok", turn.error
    out = ep.assets.get("Extract_0")
    assert out.kind.value == "rgba" and out.image.size == (40, 20)
    a = arr(out.image)
    np.testing.assert_array_equal(a[..., :3], arr(grad)[20:40, 50:90])
    np.testing.assert_array_equal(a[..., 3], mask[20:40, 50:90])
    assert turn.tool_text == "Extracted object from image using mask. Cropped from bbox: [50,20,90,40], Output size: (40, 20)"


def test_extract_rejects_non_mask_and_size_mismatch(toolbox, grad):
    _, turn = run(toolbox, [grad, grad], "Extract", {"image": "img_1", "mask": "img_2"})
    assert turn.error_code == "wrong_asset_kind"
    _, turn = run(toolbox, [grad, Image.new("L", (10, 10), 255)], "Extract", {"image": "img_1", "mask": "img_2"})
    assert turn.error_code == "mask_size_mismatch"
    _, turn = run(toolbox, [grad, Image.new("L", (200, 100), 0)], "Extract", {"image": "img_1", "mask": "img_2"})
    assert turn.error_code == "empty_mask"


# -- Overlayer -----------------------------------------------------------------------------------


def test_overlayer_object_pastes_centred_with_alpha(toolbox):
    base = Image.new("RGB", (100, 80), (255, 255, 255))
    obj = np.zeros((10, 20, 4), np.uint8)
    obj[..., 0] = 200
    obj[:, :10, 3] = 255  # left half opaque red, right half transparent
    ep, turn = run(toolbox, [base, Image.fromarray(obj, "RGBA")], "Overlayer",
                   {"base_image": "img_1", "overlay_type": "object", "content": "img_2", "position": "[300, 250]"})
    assert turn.status == "ok", turn.error
    out = arr(ep.assets.get("Overlayer_0").image)
    # centre px = int(300/1000*100) = 30, py = int(250/1000*80) = 20; top-left = (30-10, 20-5) = (20, 15)
    expected = np.full((80, 100, 3), 255, np.uint8)
    expected[15:25, 20:30] = (200, 0, 0)
    np.testing.assert_array_equal(out, expected)
    assert turn.tool_text == "Overlaid object onto image at position [300.0,250.0]. Output size: (100, 80)"


def test_overlayer_int_of_float_position_rule(cc_toolbox):
    # int(0.29 * 100) = int(28.999999999999996) = 28, while floor(290*100/1000) = 29.
    base = Image.new("RGB", (100, 100), (255, 255, 255))
    dot = Image.new("RGBA", (1, 1), (0, 0, 0, 255))
    ep, _ = run(cc_toolbox, [base, dot], "Overlayer",
                {"base_image": "img_1", "overlay_type": "object", "content": "img_2", "position": [290, 500]})
    out = arr(ep.assets.get("Overlayer_0").image)
    ys, xs = np.nonzero(out[..., 0] == 0)
    assert (xs.tolist(), ys.tolist()) == ([28], [50])


def test_overlayer_text_uses_public_placement_rule(cc_toolbox):
    base = Image.new("RGB", (400, 300), (255, 255, 255))
    ep, turn = run(cc_toolbox, [base], "Overlayer", {"base_image": "img_1", "overlay_type": "text", "content": "SALE"})
    assert turn.status == "ok"
    assert turn.tool_text == "Overlaid text onto image at position [500,500]. Output size: (400, 300)"
    # Hand-computed: size max(20, 300//20)=20; ink drawn at (200 - tw//2, 150 - th//2) with Pillow's default anchor.
    from PIL import ImageDraw

    ref = Image.new("RGBA", (400, 300), (255, 255, 255, 255))
    d = ImageDraw.Draw(ref)
    font = dejavu_sans(20)
    tb = d.textbbox((0, 0), "SALE", font=font)
    d.text((200 - (tb[2] - tb[0]) // 2, 150 - (tb[3] - tb[1]) // 2), "SALE", font=font, fill=(0, 0, 0, 255))
    np.testing.assert_array_equal(arr(ep.assets.get("Overlayer_0").image), arr(ref.convert("RGB")))
    ink = np.nonzero(arr(ep.assets.get("Overlayer_0").image)[..., 0] < 128)
    assert ink[0].mean() > 150  # ink sits a few px below the centre, the public quirk


def test_overlayer_object_needs_rgba(toolbox, grad):
    _, turn = run(toolbox, [grad, grad], "Overlayer", {"base_image": "img_1", "overlay_type": "object", "content": "img_2"})
    assert turn.error_code == "wrong_asset_kind"
    _, turn = run(toolbox, [grad], "Overlayer", {"base_image": "img_1", "overlay_type": "object", "content": "a cat"})
    assert turn.error_code == "unknown_asset"


def test_overlayer_position_out_of_range(grad):
    from toolserver.toolbox import LocalToolbox

    _, turn = run(LocalToolbox(profile=Profile.CANVASCRAFT), [grad], "Overlayer",
                  {"base_image": "img_1", "overlay_type": "text", "content": "x", "position": [1200, 500]})
    assert turn.status == "ok" and turn.check["spec_ok"] is False  # public: not range-checked, still scored
    _, turn = run(LocalToolbox(profile=Profile.EXACT), [grad], "Overlayer",
                  {"base_image": "img_1", "overlay_type": "text", "content": "x", "position": [1200, 500]})
    assert turn.status == "error" and turn.error_code == "position_out_of_range"

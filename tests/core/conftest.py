import numpy as np
import pytest
from PIL import Image

from toolserver.toolbox import LocalToolbox
from toolserver.validation import Profile


def gradient(w: int, h: int) -> Image.Image:
    """Every pixel distinct and predictable: R = x, G = y, B = (x + 2y) % 256."""
    x, y = np.meshgrid(np.arange(w), np.arange(h))
    arr = np.stack([x % 256, y % 256, (x + 2 * y) % 256], axis=-1).astype(np.uint8)
    return Image.fromarray(arr, "RGB")


@pytest.fixture
def grad():
    return gradient(200, 100)


@pytest.fixture(params=[Profile.CANVASCRAFT, Profile.EXACT], ids=lambda p: p.value)
def toolbox(request):
    return LocalToolbox(profile=request.param)


@pytest.fixture
def cc_toolbox():
    return LocalToolbox(profile=Profile.CANVASCRAFT)


@pytest.fixture
def exact_toolbox():
    return LocalToolbox(profile=Profile.EXACT)

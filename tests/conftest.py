"""Suite-wide fixtures."""

from __future__ import annotations

import sys

import pytest


@pytest.fixture(autouse=True)
def _denormals_restored():
    """The SAM backends flush denormal floats process-wide when they load (a 10x CPU speed-up);
    later tests in the same process, hypothesis's float strategies among them, need IEEE
    subnormals back."""
    yield
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.set_flush_denormal(False)

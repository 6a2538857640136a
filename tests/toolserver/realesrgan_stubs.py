"""Stand-ins for the `realesrgan` / `basicsr` / `torchvision` modules, which cannot be installed
beside the CPU torch wheel here: the tests give them the real backend's import surface so our
realesrgan backend's own code runs (the network itself is a tiny real one or a pixel repeat)."""

from __future__ import annotations

import sys
import types


def install(monkeypatch, rrdbnet, realesrganer) -> None:
    """Make `import realesrgan` etc. resolve to stand-ins for the rest of the test."""
    tv = types.ModuleType("torchvision")
    tv_transforms = types.ModuleType("torchvision.transforms")
    tv_ft = types.ModuleType("torchvision.transforms._functional_tensor")
    tv.transforms, tv_transforms._functional_tensor = tv_transforms, tv_ft
    arch = types.ModuleType("basicsr.archs.rrdbnet_arch")
    arch.RRDBNet = rrdbnet
    rg = types.ModuleType("realesrgan")
    rg.RealESRGANer = realesrganer
    for name, mod in {
        "torchvision": tv,
        "torchvision.transforms": tv_transforms,
        "torchvision.transforms._functional_tensor": tv_ft,
        "basicsr": types.ModuleType("basicsr"),
        "basicsr.archs": types.ModuleType("basicsr.archs"),
        "basicsr.archs.rrdbnet_arch": arch,
        "realesrgan": rg,
    }.items():
        monkeypatch.setitem(sys.modules, name, mod)
    # Absent now, and absent again after the test (setitem records the absence for undo).
    monkeypatch.setitem(sys.modules, "torchvision.transforms.functional_tensor", None)
    monkeypatch.delitem(sys.modules, "torchvision.transforms.functional_tensor")

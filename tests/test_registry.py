"""Finding backends by name."""

from __future__ import annotations

import subprocess
import sys

import pytest

import unitrain
from unitrain.registry import Registry


def test_available_backends():
    assert list(unitrain.available_backends()) == ["paddle", "torch"]


def test_unknown_backend_lists_available_names():
    with pytest.raises(unitrain.UnknownNameError) as err:
        unitrain.get_backend("mxnet")
    assert str(err.value) == "unknown backend 'mxnet'; available: paddle, torch"


@pytest.mark.parametrize("name,framework", [("paddle", "paddle"), ("torch", "torch")])
def test_backend_reports_its_framework(name, framework):
    backend = unitrain.get_backend(name)
    assert backend.name == name and unitrain.get_backend(name) is backend
    assert backend.version() == __import__(framework).__version__


def test_importing_unitrain_imports_no_framework():
    code = "import sys, unitrain, unitrain.app; print(sorted(m for m in ('paddle', 'torch') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip()
    assert out == "[]"


def test_choosing_torch_does_not_import_paddle():
    code = "import sys, unitrain; unitrain.get_backend('torch'); print('paddle' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip() == "False"


def test_generic_registry():
    reg: Registry[int] = Registry("widget")
    reg.register("b", 2)

    @reg.register("a")
    def _a():
        return 1

    assert reg.names() == ["a", "b"] and "a" in reg and reg.get("b") == 2
    with pytest.raises(KeyError, match="unknown widget 'c'; available: a, b"):
        reg.get("c")

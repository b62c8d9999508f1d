"""kernels.triton imports where Triton is not installed, imports no Triton at import time, and says clearly what
is missing when a kernel is asked for (no triton marker: this runs in the default suite)."""
import importlib
import sys

import pytest


def fresh_import(monkeypatch, hide_triton: bool):
    """kernels.triton imported anew (and put back as it was afterwards); Triton made unimportable if asked."""
    for name in [n for n in sys.modules if n == "kernels.triton" or n.startswith("kernels.triton.")]:
        monkeypatch.delitem(sys.modules, name)
    if hide_triton:
        for name in [n for n in sys.modules if n == "triton" or n.startswith("triton.")]:
            monkeypatch.delitem(sys.modules, name)
        monkeypatch.setitem(sys.modules, "triton", None)  # `import triton` raises ImportError, find_spec gives None
    return importlib.import_module("kernels.triton")


def test_imports_without_triton_and_says_what_is_missing(monkeypatch):
    tk = fresh_import(monkeypatch, hide_triton=True)
    assert not tk.available()
    assert "gelu_forward" in dir(tk) and "adamw_step" in tk.__all__
    with pytest.raises(ImportError, match="needs Triton, which is not installed"):
        tk.gelu_forward
    with pytest.raises(AttributeError, match="no attribute 'gelu_fwd'"):
        tk.gelu_fwd


def test_import_loads_no_triton(monkeypatch):
    fresh_import(monkeypatch, hide_triton=False)
    loaded = [n for n in sys.modules if n.startswith("kernels.triton.")]
    assert not loaded, f"importing kernels.triton imported {loaded}"

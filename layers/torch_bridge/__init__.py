"""The bridge to torch.nn: a hand-written layer as an nn.Module (``as_module``: its autograd node in ``function.py``,
the parameters it computes with at each call in ``binding.py``), and ``from_torch``/``to_torch`` (``convert.py``)."""

from .as_module import HandgradModule, as_module
from .convert import from_torch, to_torch

__all__ = ["HandgradModule", "as_module", "from_torch", "to_torch"]

"""The GPT's blocks are ``Composite`` layers: the class lives with the layers (layers/composite.py), since the
attention and the Transformer encoder of ``layers`` are written on it too."""

from layers.composite import Composite

__all__ = ["Composite"]

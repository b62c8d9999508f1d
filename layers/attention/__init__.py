"""Attention: scaled dot-product attention by hand (FlashAttention's blocked way, its one-block path, its dropout
masks), MultiheadAttention (its input rules apart) and the Transformer encoder built on them."""

from .dropout import attention_dropout_mask
from .multihead import MultiheadAttention
from .scaled_dot_product import ScaledDotProductAttention
from .transformer import TransformerEncoder, TransformerEncoderLayer

__all__ = [
    "ScaledDotProductAttention",
    "attention_dropout_mask",
    "MultiheadAttention",
    "TransformerEncoderLayer",
    "TransformerEncoder",
]

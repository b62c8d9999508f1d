"""The case family of the sequence layers: embeddings, attention (both paths, every mask), multi-head attention, the
transformer layers, the GPT and cross-entropy over sequences."""

from __future__ import annotations

import torch

import kernels
from layers import (
    Embedding,
    LayerNorm,
    MultiheadAttention,
    ScaledDotProductAttention,
    TransformerEncoder,
    TransformerEncoderLayer,
)
from losses import CrossEntropyLoss
from models import GPT

from .make import F64, Case, inputs_case, loss_case, rnd


class TextbookAttention(ScaledDotProductAttention):
    """The attention layer with the kernels off: its textbook, the (L, S) matrices kept, checked in the same run as
    the kernel's blocks (which the other attention cases run while the kernels are on)."""

    def forward(self, *args, **kwargs):
        with kernels.disabled():
            return super().forward(*args, **kwargs)

    def backward(self, *args, **kwargs):
        with kernels.disabled():
            return super().backward(*args, **kwargs)

    def __repr__(self):
        return "TextbookAttention()"


def attention() -> dict[str, list[Case]]:
    """Embedding, attention (blocked and textbook), MultiheadAttention, the transformer layers, the GPT and
    cross-entropy over (N, C, T) logits with ignore_index."""
    g = torch.Generator().manual_seed(11)
    qkv = lambda lead, L, S, E=4, Ev=3: lambda: (rnd(*lead, L, E), rnd(*lead, S, E), rnd(*lead, S, Ev))  # noqa: E731
    allowed = torch.rand(2, 4, 5, generator=g) > 0.3  # (N, L, S) bool, True = may attend
    allowed[:, :, 0] = True
    row_masked = allowed.clone()
    row_masked[1, 2] = False  # a query that sees no key: zeros and zero gradients, as torch
    bias = torch.randn(4, 5, generator=g, dtype=F64)
    sdpa = lambda: ScaledDotProductAttention(block_size=2)  # noqa: E731  (several blocks even at these sizes)
    mha = lambda **kw: lambda: nontrivial_biases(MultiheadAttention(6, 2, dtype=F64, **kw))  # noqa: E731
    kpm = torch.tensor([[False, False, True, True], [False, False, False, False]])  # (N, S) True = padding
    enc = lambda **kw: lambda: nontrivial_biases(TransformerEncoderLayer(4, 2, 6, dtype=F64, **kw))  # noqa: E731
    return {
        "embedding": [
            inputs_case(
                "Embedding(7,3)", lambda: Embedding(7, 3, dtype=F64), lambda: torch.tensor([[0, 6, 6, 2], [3, 0, 1, 6]])
            ),
            inputs_case(
                "Embedding(5,4,padding_idx=1) [ids avoid the padding row]",
                lambda: Embedding(5, 4, padding_idx=1, dtype=F64),
                lambda: torch.tensor([4, 0, 4]),
            ),
        ],
        "scaleddotproductattention": [
            inputs_case("SDPA", sdpa, qkv((2,), 4, 5)),
            inputs_case("SDPA(causal, L>S)", sdpa, qkv((2,), 6, 4), is_causal=True),
            inputs_case("SDPA(causal, L<S)", sdpa, qkv((1, 2), 3, 5), is_causal=True),
            inputs_case("SDPA(bool mask)", sdpa, qkv((2,), 4, 5), attn_mask=allowed),
            inputs_case("SDPA(bool mask, a fully masked row)", sdpa, qkv((2,), 4, 5), attn_mask=row_masked),
            inputs_case("SDPA(float mask, scale=0.3)", sdpa, qkv((2,), 4, 5), attn_mask=bias, scale=0.3),
            inputs_case("SDPA(dropout 0.3)", sdpa, qkv((2,), 4, 5), dropout_p=0.3),
            inputs_case(
                "SDPA(need_weights, dropout 0.3, causal)",
                sdpa,
                qkv((2,), 4, 4),
                dropout_p=0.3,
                is_causal=True,
                need_weights=True,
            ),
        ],
        "attention-textbook": [
            inputs_case("TextbookAttention", TextbookAttention, qkv((2,), 4, 5)),
            inputs_case("TextbookAttention(causal)", TextbookAttention, qkv((2,), 5, 5), is_causal=True),
            inputs_case(
                "TextbookAttention(bool mask, a fully masked row)",
                TextbookAttention,
                qkv((2,), 4, 5),
                attn_mask=row_masked,
            ),
            inputs_case(
                "TextbookAttention(float mask, dropout 0.3, need_weights)",
                TextbookAttention,
                qkv((2,), 4, 5),
                attn_mask=bias,
                dropout_p=0.3,
                need_weights=True,
            ),
        ],
        "multiheadattention": [
            inputs_case("MHA(6,2) self", mha(), lambda: (lambda x: (x, x.clone(), x.clone()))(rnd(3, 2, 6))),
            inputs_case(
                "MHA(6,2,add_bias_kv,add_zero_attn) cross, key padding",
                mha(add_bias_kv=True, add_zero_attn=True),
                lambda: (rnd(3, 2, 6), rnd(4, 2, 6), rnd(4, 2, 6)),
                key_padding_mask=kpm,
            ),
            inputs_case(
                "MHA(6,2,kdim=3,vdim=5,batch_first) float attn_mask, per-head weights",
                mha(kdim=3, vdim=5, batch_first=True),
                lambda: (rnd(2, 3, 6), rnd(2, 4, 3), rnd(2, 4, 5)),
                attn_mask=torch.randn(3, 4, generator=g, dtype=F64),
                average_attn_weights=False,
            ),
            inputs_case(
                "MHA(6,2) causal hint, no weights",
                mha(),
                lambda: (lambda x: (x, x.clone(), x.clone()))(rnd(4, 2, 6)),
                need_weights=False,
                attn_mask=torch.nn.Transformer.generate_square_subsequent_mask(4, dtype=F64),
                is_causal=True,
            ),
            inputs_case(
                "MHA(6,2,dropout=0.3) unbatched",
                mha(dropout=0.3),
                lambda: (rnd(3, 6), rnd(4, 6), rnd(4, 6)),
                mode="train",
            ),
        ],
        "transformerencoderlayer": [
            inputs_case(
                "TransformerEncoderLayer(4,2,6) post-norm",
                enc(dropout=0.0),
                lambda: rnd(3, 2, 4),
                src_key_padding_mask=kpm[:, :3],
            ),
            inputs_case(
                "TransformerEncoderLayer(4,2,6,gelu) pre-norm, dropout",
                enc(norm_first=True, activation="gelu", dropout=0.2),
                lambda: rnd(3, 2, 4),
                mode="train",
            ),
        ],
        "transformerencoder": [
            inputs_case(
                "TransformerEncoder(2 layers, norm) causal",
                lambda: nontrivial_biases(
                    TransformerEncoder(
                        TransformerEncoderLayer(4, 2, 6, dropout=0.0, dtype=F64), 2, norm=LayerNorm(4, dtype=F64)
                    )
                ),
                lambda: rnd(4, 1, 4),
                mask=torch.nn.Transformer.generate_square_subsequent_mask(4, dtype=F64),
            )
        ],
        "gpt": [
            inputs_case(
                "GPT(V=7,block=5,L=2,nh=2,C=4,dropout=0.1)",
                lambda: unit_scale(
                    GPT(vocab_size=7, block_size=5, n_layer=2, n_head=2, n_embd=4, dropout=0.1, dtype=F64)
                ),
                lambda: torch.tensor([[0, 3, 6, 6, 1], [2, 1, 4, 0, 5]]),
                mode="train",
            )
        ],
        "crossentropyloss-sequence": [
            loss_case(
                "CrossEntropy(ignore_index=0) x(N,C,T)",
                lambda: CrossEntropyLoss(ignore_index=0),
                (3, 4, 5),
                lambda x: torch.randint(0, 4, (3, 5)),
            ),
            loss_case(
                "CrossEntropy(ignore_index=-1,smooth=0.1,sum)",
                lambda: CrossEntropyLoss("sum", label_smoothing=0.1, ignore_index=-1),
                (6, 5),
                lambda x: torch.tensor([0, -1, 4, -1, 2, 1]),
            ),
        ],
    }


def nontrivial_biases(layer):
    """Biases away from their zero initialisation (a zero bias hides a wrong bias gradient's effect on others)."""
    with torch.no_grad():
        for name, t in layer.named_parameters():
            if "bias" in name.rsplit(".", 1)[-1]:
                t.copy_(torch.randn_like(t) * 0.5)
    return layer


def unit_scale(model):
    """Every parameter drawn at scale ~0.5 (layer-norm gains in [0.5, 1.5]): GPT's N(0, 0.02) initialisation makes
    the early layers' gradients ~1e-5, where central differences' ~1e-10 absolute error is 1e-5 relative."""
    with torch.no_grad():
        for name, t in model.named_parameters():
            is_gain = t.dim() == 1 and "ln" in name and name.endswith("weight")
            t.copy_(torch.rand_like(t) + 0.5 if is_gain else torch.randn_like(t) * 0.5)
    return model

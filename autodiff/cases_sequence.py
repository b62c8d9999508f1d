"""gradcheck's built-in cases, second part: attention (both paths, every mask), transformer layers, the GPT and the
recurrent layers and cells, the last checked against torch's own kernels as the autograd oracle."""
from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from layers import (GRU, LSTM, RNN, Embedding, GRUCell, Layer, LayerNorm, LSTMCell, MultiheadAttention, RNNCell,
                    ScaledDotProductAttention, TransformerEncoder, TransformerEncoderLayer, attention_dropout_mask)
from layers.reference import attention_backward, attention_bias, attention_forward
from losses import CrossEntropyLoss
from models import GPT, RecurrentLM, seeded_dropouts

from .cases import F64, Case, inputs_case, loss_case, rnd
from .gradcheck import check_layer
from .numeric import GradResult

class TextbookAttention:
    """``layers.reference``'s attention_forward/attention_backward as a layer, so that the textbook path is checked
    like the blocked one: forward(q, k, v, attn_mask=None, is_causal=False, dropout_mask=None)."""

    def __call__(self, *args, **kwargs):
        return self.forward(*args, **kwargs)

    def forward(self, q, k, v, attn_mask=None, is_causal=False, dropout_mask=None):
        bias = attention_bias(q.shape[-2], k.shape[-2], attn_mask, is_causal, dtype=q.dtype)
        out, self.cache = attention_forward(q, k, v, bias, dropout_mask=dropout_mask)
        return out

    def backward(self, dout):
        return attention_backward(dout, self.cache)

    def parameters(self):
        return []

    def __repr__(self):
        return "TextbookAttention()"


def _attention_cases() -> dict[str, list[Case]]:
    g = torch.Generator().manual_seed(11)
    qkv = lambda lead, L, S, E=4, Ev=3: lambda: (rnd(*lead, L, E), rnd(*lead, S, E), rnd(*lead, S, Ev))  # noqa: E731
    allowed = torch.rand(2, 4, 5, generator=g) > 0.3  # (N, L, S) bool, True = may attend
    allowed[:, :, 0] = True
    row_masked = allowed.clone()
    row_masked[1, 2] = False  # a query that sees no key: zeros and zero gradients, as torch
    bias = torch.randn(4, 5, generator=g, dtype=F64)
    drop = attention_dropout_mask(5, 0.3, 2, 4, 5, dtype=F64)
    sdpa = lambda: ScaledDotProductAttention(block_size=2)  # noqa: E731  (several blocks even at these sizes)
    mha = lambda **kw: lambda: nontrivial_biases(MultiheadAttention(6, 2, dtype=F64, **kw))  # noqa: E731
    kpm = torch.tensor([[False, False, True, True], [False, False, False, False]])  # (N, S) True = padding
    enc = lambda **kw: lambda: nontrivial_biases(TransformerEncoderLayer(4, 2, 6, dtype=F64, **kw))  # noqa: E731
    return {
        "embedding": [inputs_case("Embedding(7,3)", lambda: Embedding(7, 3, dtype=F64),
                                  lambda: torch.tensor([[0, 6, 6, 2], [3, 0, 1, 6]])),
                      inputs_case("Embedding(5,4,padding_idx=1) [ids avoid the padding row]",
                                  lambda: Embedding(5, 4, padding_idx=1, dtype=F64), lambda: torch.tensor([4, 0, 4]))],
        "scaleddotproductattention": [inputs_case("SDPA", sdpa, qkv((2,), 4, 5)),
                      inputs_case("SDPA(causal, L>S)", sdpa, qkv((2,), 6, 4), is_causal=True),
                      inputs_case("SDPA(causal, L<S)", sdpa, qkv((1, 2), 3, 5), is_causal=True),
                      inputs_case("SDPA(bool mask)", sdpa, qkv((2,), 4, 5), attn_mask=allowed),
                      inputs_case("SDPA(bool mask, a fully masked row)", sdpa, qkv((2,), 4, 5), attn_mask=row_masked),
                      inputs_case("SDPA(float mask, scale=0.3)", sdpa, qkv((2,), 4, 5), attn_mask=bias, scale=0.3),
                      inputs_case("SDPA(dropout 0.3)", sdpa, qkv((2,), 4, 5), dropout_p=0.3),
                      inputs_case("SDPA(need_weights, dropout 0.3, causal)", sdpa, qkv((2,), 4, 4), dropout_p=0.3,
                                  is_causal=True, need_weights=True)],
        "attention-textbook": [inputs_case("TextbookAttention", TextbookAttention, qkv((2,), 4, 5)),
                               inputs_case("TextbookAttention(causal)", TextbookAttention, qkv((2,), 5, 5),
                                           is_causal=True),
                               inputs_case("TextbookAttention(bool mask, a fully masked row)", TextbookAttention,
                                           qkv((2,), 4, 5), attn_mask=row_masked),
                               inputs_case("TextbookAttention(float mask, dropout mask)", TextbookAttention,
                                           qkv((2,), 4, 5), attn_mask=bias, dropout_mask=drop)],
        "multiheadattention": [
            inputs_case("MHA(6,2) self", mha(), lambda: (lambda x: (x, x.clone(), x.clone()))(rnd(3, 2, 6))),
            inputs_case("MHA(6,2,add_bias_kv,add_zero_attn) cross, key padding", mha(add_bias_kv=True, add_zero_attn=True),
                        lambda: (rnd(3, 2, 6), rnd(4, 2, 6), rnd(4, 2, 6)), key_padding_mask=kpm),
            inputs_case("MHA(6,2,kdim=3,vdim=5,batch_first) float attn_mask, per-head weights",
                        mha(kdim=3, vdim=5, batch_first=True), lambda: (rnd(2, 3, 6), rnd(2, 4, 3), rnd(2, 4, 5)),
                        attn_mask=torch.randn(3, 4, generator=g, dtype=F64), average_attn_weights=False),
            inputs_case("MHA(6,2) causal hint, no weights", mha(),
                        lambda: (lambda x: (x, x.clone(), x.clone()))(rnd(4, 2, 6)), need_weights=False,
                        attn_mask=torch.nn.Transformer.generate_square_subsequent_mask(4, dtype=F64), is_causal=True),
            inputs_case("MHA(6,2,dropout=0.3) unbatched", mha(dropout=0.3), lambda: (rnd(3, 6), rnd(4, 6), rnd(4, 6)),
                        mode="train")],
        "transformerencoderlayer": [
            inputs_case("TransformerEncoderLayer(4,2,6) post-norm", enc(dropout=0.0), lambda: rnd(3, 2, 4),
                        src_key_padding_mask=kpm[:, :3]),
            inputs_case("TransformerEncoderLayer(4,2,6,gelu) pre-norm, dropout", enc(norm_first=True, activation="gelu",
                                                                                      dropout=0.2),
                        lambda: rnd(3, 2, 4), mode="train")],
        "transformerencoder": [
            inputs_case("TransformerEncoder(2 layers, norm) causal",
                        lambda: nontrivial_biases(TransformerEncoder(TransformerEncoderLayer(4, 2, 6, dropout=0.0,
                                                                                            dtype=F64), 2,
                                                                     norm=LayerNorm(4, dtype=F64))),
                        lambda: rnd(4, 1, 4), mask=torch.nn.Transformer.generate_square_subsequent_mask(4, dtype=F64))],
        "gpt": [inputs_case("GPT(V=7,block=5,L=2,nh=2,C=4,dropout=0.1)",
                            lambda: unit_scale(GPT(vocab_size=7, block_size=5, n_layer=2, n_head=2, n_embd=4,
                                                   dropout=0.1, dtype=F64)),
                            lambda: torch.tensor([[0, 3, 6, 6, 1], [2, 1, 4, 0, 5]]), mode="train")],
        "crossentropyloss-sequence": [
            loss_case("CrossEntropy(ignore_index=0) x(N,C,T)", lambda: CrossEntropyLoss(ignore_index=0), (3, 4, 5),
                      lambda x: torch.randint(0, 4, (3, 5))),
            loss_case("CrossEntropy(ignore_index=-1,smooth=0.1,sum)",
                      lambda: CrossEntropyLoss("sum", label_smoothing=0.1, ignore_index=-1), (6, 5),
                      lambda x: torch.tensor([0, -1, 4, -1, 2, 1]))],
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


class _TorchOracle:
    """A recurrent layer (RNN, LSTM, GRU, the cells) for check_layer, with torch.nn's kernels as the autograd oracle.

    These layers write into preallocated buffers with out=, which autograd cannot record, and say so
    (``autograd_opaque``).  Under grad mode -- only check_layer's autograd pass -- this runs their torch.nn twin
    instead, ``seeded_dropouts(layer.to_torch())`` (the same dropout masks), with the layer's own parameter tensors
    (in torch's layouts, as views) swapped in by ``torch.func.functional_call``: "vs autograd" is then the
    hand-written backward against autograd through nn.LSTM's (nn.GRU's, ...) own kernels, on the same weights and
    inputs.  Every other call is the layer's.
    """

    def __init__(self, layer):
        self.layer = layer
        self.twin = seeded_dropouts(layer.to_torch())

    def __repr__(self) -> str:
        return repr(self.layer)

    def named_parameters(self):
        return self.layer.named_parameters()

    def parameters(self) -> list[Tensor]:
        return self.layer.parameters()

    def forward(self, x, hx=None):
        if not torch.is_grad_enabled():
            return self.layer.forward(x, hx)
        self.twin.train(self.layer.training)
        return torch.func.functional_call(self.twin, self._attached_state(), (x,) if hx is None else (x, hx))

    def _attached_state(self) -> dict[str, Tensor]:
        """The layer's state_dict (torch's layouts: a Linear's weight as (H, D)) with each tensor rebuilt as a view
        of the parameter whose memory it shares: state_dict detaches, as torch.nn's does, and autograd must reach
        the parameters."""
        params = {p.untyped_storage().data_ptr(): p for p in self.layer.parameters()}
        state = {}
        for key, t in self.layer.state_dict().items():
            p = params.get(t.untyped_storage().data_ptr())
            state[key] = t if p is None else p.as_strided(t.shape, t.stride(), t.storage_offset())
        return state

    def backward(self, *douts):
        return self.layer.backward(*douts)


def recurrent_case(label: str, make: Callable[[], Layer], x_shape: tuple[int, ...],
                   states: tuple | None = None, mode: str | None = None, vocab: int | None = None) -> Case:
    """A check of a recurrent layer or cell on a random input of ``x_shape`` (token ids below ``vocab`` if given)
    and, when ``states`` gives their shapes (a shape, or a pair of shapes for the LSTM's (h_0, c_0)), random
    initial states: their gradients are checked too.  The autograd oracle is the torch.nn twin (``_TorchOracle``)."""
    def run(fast: bool) -> list[GradResult]:
        layer = make()
        if mode is not None:
            layer.train(mode == "train")
        x = rnd(*x_shape) if vocab is None else torch.randint(0, vocab, x_shape)
        if states is None:
            inputs = x
        else:
            hx = tuple(rnd(*s) for s in states) if isinstance(states[0], tuple) else rnd(*states)
            inputs = (x, hx)
        tag = f" [{mode}]" if mode else ""
        where = f" x{x_shape}" + ("" if states is None else f" hx{states}")
        return check_layer(_TorchOracle(layer), inputs, name=f"{label}{tag}{where}", fast=fast)
    return run


def _recurrent_cases() -> dict[str, list[Case]]:
    """Small sizes (T = 3-4, batch 2, hidden 3-5): every entry of every weight is perturbed twice."""
    def make(cls, *a, **kw):
        return lambda: cls(*a, dtype=F64, **kw)
    return {
        "rnn": [recurrent_case("RNN(3,4)", make(RNN, 3, 4), (4, 2, 3)),
                recurrent_case("RNN(3,4,relu,2 layers)", make(RNN, 3, 4, 2, "relu"), (4, 2, 3), (2, 2, 4)),
                recurrent_case("RNN(3,3,bidirectional,batch_first,bias=False)",
                               make(RNN, 3, 3, bias=False, batch_first=True, bidirectional=True), (2, 4, 3), (2, 2, 3)),
                recurrent_case("RNN(3,4) unbatched", make(RNN, 3, 4), (4, 3), (1, 4))],
        "lstm": [recurrent_case("LSTM(3,4)", make(LSTM, 3, 4), (4, 2, 3)),
                 recurrent_case("LSTM(3,3,2 layers,bidirectional)", make(LSTM, 3, 3, 2, bidirectional=True),
                                (3, 2, 3), ((4, 2, 3), (4, 2, 3))),
                 recurrent_case("LSTM(3,4,proj_size=2,batch_first)", make(LSTM, 3, 4, proj_size=2, batch_first=True),
                                (2, 4, 3), ((1, 2, 2), (1, 2, 4))),
                 recurrent_case("LSTM(3,3,2 layers,dropout=0.4)", make(LSTM, 3, 3, 2, dropout=0.4), (3, 2, 3),
                                mode="train"),
                 recurrent_case("LSTM(2,3,proj_size=2,bidirectional) unbatched",
                                make(LSTM, 2, 3, proj_size=2, bidirectional=True), (3, 2), ((2, 2), (2, 3)))],
        "gru": [recurrent_case("GRU(3,4)", make(GRU, 3, 4), (4, 2, 3), (1, 2, 4)),
                recurrent_case("GRU(3,3,2 layers,bidirectional,batch_first)",
                               make(GRU, 3, 3, 2, batch_first=True, bidirectional=True), (2, 3, 3), (4, 2, 3)),
                recurrent_case("GRU(3,4,bias=False) unbatched", make(GRU, 3, 4, bias=False), (4, 3), (1, 4))],
        "rnncell": [recurrent_case("RNNCell(3,4)", make(RNNCell, 3, 4), (2, 3), (2, 4)),
                    recurrent_case("RNNCell(3,4,relu)", make(RNNCell, 3, 4, nonlinearity="relu"), (2, 3)),
                    recurrent_case("RNNCell(3,4) unbatched", make(RNNCell, 3, 4), (3,), (4,))],
        "lstmcell": [recurrent_case("LSTMCell(3,4)", make(LSTMCell, 3, 4), (2, 3), ((2, 4), (2, 4))),
                     recurrent_case("LSTMCell(3,4)", make(LSTMCell, 3, 4), (2, 3)),
                     recurrent_case("LSTMCell(3,4,bias=False) unbatched", make(LSTMCell, 3, 4, bias=False), (3,),
                                    ((4,), (4,)))],
        "grucell": [recurrent_case("GRUCell(3,4)", make(GRUCell, 3, 4), (2, 3), (2, 4)),
                    recurrent_case("GRUCell(3,4) unbatched", make(GRUCell, 3, 4), (3,), (4,))],
        "recurrentlm": [recurrent_case("RecurrentLM(5,3,4,2 layers,lstm,dropout=0.3)",
                                       make(RecurrentLM, 5, 3, 4, 2, dropout=0.3), (2, 3), ((2, 2, 4), (2, 2, 4)),
                                       mode="train", vocab=5),
                        recurrent_case("RecurrentLM(5,3,4,gru)", make(RecurrentLM, 5, 3, 4, cell="gru"), (2, 3),
                                       vocab=5)],
    }


# One function per family of layers; each returns {command-line name: [cases]}.

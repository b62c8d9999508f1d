"""TransformerEncoderLayer / TransformerEncoder against torch.nn's under autograd, float64, T = 128: post- and
pre-norm, batch_first both ways, every mask kind; weights under one seed, conversion both ways, gradcheck."""

import pytest
import torch
from torch import nn

from gradcheck import check_layer
from layers import LayerNorm, TransformerEncoder, TransformerEncoderLayer, from_torch
from tests.conftest import assert_all_pass, named_grads
from tests.test_multihead import close

F64 = torch.float64
E, H, FF, N, T = 16, 4, 32, 2, 128
# torch warns that mixing a float src_mask with a bool padding mask is deprecated: both kinds are tested on purpose
pytestmark = pytest.mark.filterwarnings("ignore:Support for mismatched")


def masks():
    g = torch.Generator().manual_seed(4)
    kpm = torch.zeros(N, T, dtype=torch.bool)
    kpm[1, 100:] = True
    causal = nn.Transformer.generate_square_subsequent_mask(T, dtype=F64)
    return {
        "none": {},
        "causal (mask + is_causal)": {"src_mask": causal, "is_causal": True},
        "key padding": {"src_key_padding_mask": kpm},
        "bool mask": {"src_mask": torch.rand(T, T, generator=g) > 0.9},
        "float mask and key padding": {
            "src_mask": torch.randn(T, T, generator=g, dtype=F64),
            "src_key_padding_mask": kpm,
        },
    }


def run_both(ours, theirs, x, **kw):
    xt = x.clone().requires_grad_(True)
    out, ref = ours(x, **kw), theirs(xt, **kw)
    close(out, ref.detach())
    dout = torch.randn_like(out)
    dx = ours.backward(dout)
    ref.backward(dout)
    close(dx, xt.grad)
    grads = named_grads(ours)
    for name, p in theirs.named_parameters():
        close(grads[name], p.grad)


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("batch_first", [False, True])
@pytest.mark.parametrize("mask", list(masks()))
def test_encoder_layer_equals_torch_float64_T128(norm_first, batch_first, mask):
    kw = dict(
        dim_feedforward=FF,
        dropout=0.0,
        norm_first=norm_first,
        batch_first=batch_first,
        dtype=F64,
        activation="gelu" if norm_first else "relu",
    )
    torch.manual_seed(0)
    ours = TransformerEncoderLayer(E, H, **kw)
    torch.manual_seed(0)
    theirs = nn.TransformerEncoderLayer(E, H, **kw)
    assert all(torch.equal(a, b) for a, b in zip(ours.state_dict().values(), theirs.state_dict().values(), strict=True))
    x = torch.randn((N, T, E) if batch_first else (T, N, E), generator=torch.Generator().manual_seed(1), dtype=F64)
    run_both(ours, theirs, x, **masks()[mask])


@pytest.mark.parametrize("norm_first", [False, True])
def test_encoder_stack_with_final_norm_equals_torch(norm_first):
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(E, H, FF, dropout=0.0, norm_first=norm_first, bias=not norm_first, dtype=F64)
    theirs = nn.TransformerEncoder(layer, 3, norm=nn.LayerNorm(E, dtype=F64), enable_nested_tensor=False)
    ours = from_torch(theirs)
    assert isinstance(ours, TransformerEncoder) and list(ours.state_dict()) == list(theirs.state_dict())
    x = torch.randn(T, N, E, generator=torch.Generator().manual_seed(2), dtype=F64)
    causal = nn.Transformer.generate_square_subsequent_mask(T, dtype=F64)
    run_both(ours, theirs, x, mask=causal)  # is_causal detected from the mask, as torch does
    back = ours.to_torch()
    assert isinstance(back, nn.TransformerEncoder)
    close(back(x, mask=causal).detach(), theirs(x, mask=causal).detach(), 1e-14)


def test_same_weights_under_one_seed_for_the_stack():
    torch.manual_seed(3)
    ours = TransformerEncoder(TransformerEncoderLayer(E, H, FF, dtype=F64), 2, norm=LayerNorm(E, dtype=F64))
    torch.manual_seed(3)
    theirs = nn.TransformerEncoder(
        nn.TransformerEncoderLayer(E, H, FF, dtype=F64), 2, norm=nn.LayerNorm(E, dtype=F64), enable_nested_tensor=False
    )
    sd_o, sd_t = ours.state_dict(), theirs.state_dict()
    assert list(sd_o) == list(sd_t) and all(torch.equal(sd_o[k], sd_t[k]) for k in sd_t)
    assert "layers.1.self_attn.in_proj_weight" in sd_o and "norm.weight" in sd_o


def test_unbatched_input():
    torch.manual_seed(0)
    theirs = nn.TransformerEncoderLayer(E, H, FF, dropout=0.0, dtype=F64)
    ours = from_torch(theirs)
    run_both(ours, theirs, torch.randn(9, E, dtype=F64))


@pytest.mark.parametrize("norm_first", [False, True])
def test_gradcheck_in_training_mode_with_dropout(norm_first):
    torch.manual_seed(0)
    layer = TransformerEncoderLayer(4, 2, dim_feedforward=6, dropout=0.2, norm_first=norm_first, dtype=F64)
    kpm = torch.tensor([[False, False, True], [False, False, False]])
    assert_all_pass(check_layer(layer, torch.randn(3, 2, 4, dtype=F64), forward_kwargs={"src_key_padding_mask": kpm}))


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match=r"activation must be 'relu' or 'gelu' \(or F.relu / F.gelu\), got 'tanh'"):
        TransformerEncoderLayer(8, 2, activation="tanh")
    with pytest.raises(ValueError, match="embed_dim 8 is not divisible by num_heads 3"):
        TransformerEncoderLayer(8, 3)
    with pytest.raises(
        TypeError, match="encoder_layer must be a layers.TransformerEncoderLayer, got TransformerEncoderLayer"
    ):
        TransformerEncoder(nn.TransformerEncoderLayer(8, 2), 2)
    layer = TransformerEncoderLayer(8, 2, 16, dropout=0.0)
    out = layer(torch.randn(3, 2, 8))
    with pytest.raises(ValueError, match=r"dout has shape \(3, 2, 7\) but the forward output had shape \(3, 2, 8\)"):
        layer.backward(torch.ones(3, 2, 7))
    with pytest.raises(RuntimeError, match="backward called before forward"):
        TransformerEncoderLayer(8, 2).backward(out)

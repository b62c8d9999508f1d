"""load_state_dict answers as torch's: it returns ``(missing_keys, unexpected_keys)`` (torch's _IncompatibleKeys),
and a state_dict saved through torch.compile (``_orig_mod.``) or DDP (``module.``) is named as such, with the fix."""

import pytest
import torch
from torch import nn
from torch.nn.modules.module import _IncompatibleKeys
from torch.nn.modules.utils import consume_prefix_in_state_dict_if_present

from layers import Linear, from_torch
from models import GPT, Net, PytorchGPT

F64 = torch.float64


def _pairs():
    torch.manual_seed(0)
    twin = nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2))
    yield "Sequential", from_torch(twin), twin
    net = Net(hidden_size=5, num_classes=3, in_features=4)
    yield "Net", net, net.to_torch()
    yield "Linear", Linear(4, 3), nn.Linear(4, 3)
    gpt = GPT(vocab_size=11, block_size=4, n_layer=1, n_head=2, n_embd=8, dropout=0.0)
    yield "GPT", gpt, gpt.to_torch()


@pytest.mark.parametrize("name, ours, theirs", list(_pairs()), ids=lambda v: v if isinstance(v, str) else "")
def test_load_state_dict_returns_torchs_missing_and_unexpected_keys(name, ours, theirs):
    sd = dict(theirs.state_dict())
    full_o, full_t = ours.load_state_dict(sd), theirs.load_state_dict(sd)
    assert type(full_o) is _IncompatibleKeys and full_o == full_t == ([], [])
    dropped = next(k for k in sd if k != "lm_head.weight")
    partial = {k: v for k, v in sd.items() if k != dropped}
    partial["extra.weight"] = torch.zeros(1)
    got, want = ours.load_state_dict(partial, strict=False), theirs.load_state_dict(partial, strict=False)
    assert type(got) is _IncompatibleKeys
    assert got.missing_keys == want.missing_keys == [dropped] and got.unexpected_keys == want.unexpected_keys


@pytest.mark.parametrize("prefix, wrapper", [("_orig_mod.", "torch.compile"), ("module.", "DistributedDataParallel")])
@pytest.mark.parametrize("name, ours, theirs", list(_pairs()), ids=lambda v: v if isinstance(v, str) else "")
def test_a_wrappers_prefix_on_every_key_is_named_with_the_fix(prefix, wrapper, name, ours, theirs):
    sd = {prefix + k: v.clone() for k, v in theirs.state_dict().items()}
    with pytest.raises(
        KeyError,
        match=rf"{name}.load_state_dict: every key starts with '{prefix}' \(a state_dict "
        rf"saved from a {wrapper}.*consume_prefix_in_state_dict_if_present",
    ) as e:
        ours.load_state_dict(sd)
    assert "\n" not in str(e.value) and len(str(e.value)) < 400  # one line, not every key
    consume_prefix_in_state_dict_if_present(sd, prefix)  # the fix the message gives loads it
    assert ours.load_state_dict(sd) == ([], [])


def test_a_compiled_gpts_state_dict_is_named():
    gpt = GPT(vocab_size=11, block_size=4, n_layer=1, n_head=2, n_embd=8, dropout=0.0)
    compiled = torch.compile(PytorchGPT(vocab_size=11, block_size=4, n_layer=1, n_head=2, n_embd=8, dropout=0.0))
    with pytest.raises(KeyError, match=r"GPT.load_state_dict: every key starts with '_orig_mod.'"):
        gpt.load_state_dict(compiled.state_dict())

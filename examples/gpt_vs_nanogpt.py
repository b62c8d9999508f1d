"""The hand-written GPT loads nanoGPT's weights and gives nanoGPT's numbers, float64: prints the worst relative
error of the logits, the loss, every gradient (the tied matrix's included) and the loss over 10 AdamW steps.

    python examples/gpt_vs_nanogpt.py

nanoGPT's model.py is the copy in tests/anchors (karpathy/nanoGPT, MIT licence); tests/test_gpt.py asserts the
same comparisons (bounds 1e-10, and 1e-9 over the AdamW steps).
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository, for tests/anchors
from losses import CrossEntropyLoss  # noqa: E402
from models import GPT  # noqa: E402
from optimizers import AdamW  # noqa: E402
from tests.anchors.nanogpt_model import GPT as NanoGPT  # noqa: E402
from tests.anchors.nanogpt_model import GPTConfig

CFG = dict(vocab_size=65, block_size=64, n_layer=2, n_head=4, n_embd=64, dropout=0.0, bias=False)


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    """max|a - b| / max(max|a|, max|b|, 1e-3)."""
    return ((a - b).abs().max() / max(a.abs().max().item(), b.abs().max().item(), 1e-3)).item()


def main() -> int:
    torch.manual_seed(0)
    torch.set_default_dtype(torch.float64)  # nanoGPT's model takes no dtype argument
    theirs = NanoGPT(GPTConfig(**CFG))
    torch.set_default_dtype(torch.float32)
    mine = GPT(**CFG, dtype=torch.float64)
    mine.load_state_dict(theirs.state_dict(), strict=True)  # nanoGPT's keys, lm_head.weight included

    g = torch.Generator().manual_seed(1)
    batches = [
        (torch.randint(0, 65, (8, 64), generator=g), torch.randint(0, 65, (8, 64), generator=g)) for _ in range(10)
    ]
    crit = CrossEntropyLoss()
    idx, tgt = batches[0]
    logits = mine(idx)
    loss = crit(logits.view(-1, 65), tgt.view(-1))
    mine.backward(crit.backward().view_as(logits))
    ref_logits, ref_loss = theirs(idx, tgt)
    ref_loss.backward()
    ours_grads = {n: p.grad for n, p in mine.named_parameters()}  # torch's names and layouts, as nanoGPT's
    grad_err = max(rel(ours_grads[n], p.grad) for n, p in theirs.named_parameters())
    print(f"logits   {rel(logits, ref_logits.detach()):.1e}")
    print(f"loss     {rel(loss, ref_loss.detach()):.1e}")
    print(f"gradients (all {len(ours_grads)}, worst) {grad_err:.1e}")

    def groups(named):  # decay the matrices, not the biases and norms' gains
        return [
            {"params": [p for _, p in named if p.dim() >= 2], "weight_decay": 0.1},
            {"params": [p for _, p in named if p.dim() < 2], "weight_decay": 0.0},
        ]

    opt = AdamW(groups(list(mine.named_parameters())), lr=1e-3, betas=(0.9, 0.99))
    opt_t = theirs.configure_optimizers(0.1, 1e-3, (0.9, 0.99), "cpu")
    worst = 0.0
    for idx, tgt in batches:
        opt.zero_grad()
        logits = mine(idx)
        loss = crit(logits.view(-1, 65), tgt.view(-1))
        mine.backward(crit.backward().view_as(logits))
        opt.step()
        opt_t.zero_grad()
        _, ref = theirs(idx, tgt)
        ref.backward()
        opt_t.step()
        worst = max(worst, abs(loss.item() - ref.item()) / abs(ref.item()))
    print(f"loss over 10 AdamW steps (worst) {worst:.1e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

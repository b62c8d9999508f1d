"""The catalogue of wrong answers, each written as a learner would write it, caught by the checker and named.

Each wrong answer is the worked solution with a few lines changed, the way a learner gets them wrong; the check
must fail (exit 1) and name exactly the mistake it was built for.  A last test makes sure every mistake of the
catalogue (learn.checker.specs.catalogue) has its wrong answer here.
"""

import pytest

from learn.checker import check_path
from learn.checker.specs import catalogue
from learn.exercises import get
from learn.source import solution_text

_GRAD_INIT = "            if p.grad is None:\n                p.grad = torch.zeros_like(p)\n"
_VALUE_WALK = """        order, seen = [], set()
        stack = [(self, False)]
        while stack:  # depth first; a node goes into order once all its inputs are in
            node, inputs_done = stack.pop()
            if inputs_done:
                order.append(node)
            elif id(node) not in seen:
                seen.add(id(node))
                stack.append((node, True))
                stack.extend((p, False) for p in node._prev if id(p) not in seen)
        self.grad = 1.0
        for node in reversed(order):
            node._backward()
"""
_PREORDER = """        self.grad = 1.0
        seen, stack = set(), [self]
        while stack:
            node = stack.pop()
            if id(node) not in seen:
                seen.add(id(node))
                node._backward()
                stack.extend(reversed(node._prev))
"""
_BFS = """        self.grad = 1.0
        queue, seen = [self], {id(self)}
        while queue:
            node = queue.pop(0)
            node._backward()
            for p in node._prev:
                if id(p) not in seen:
                    seen.add(id(p))
                    queue.append(p)
"""
_RECURSIVE_WALK = """        self.grad = 1.0

        def visit(node):
            node._backward()
            for p in node._prev:
                visit(p)
        visit(self)
"""
_RECURSIVE_TOPO = """        order, seen = [], set()

        def build(node):
            if id(node) not in seen:
                seen.add(id(node))
                for p in node._prev:
                    build(p)
                order.append(node)
        build(self)
        self.grad = 1.0
        for node in reversed(order):
            node._backward()
"""
_DIAGONAL_CE = """        dp = torch.zeros_like(self.p)
        dp[torch.arange(n), self.target] = -1 / (n * self.p[torch.arange(n), self.target])
        dlogits = dp * self.p * (1 - self.p)  # through the softmax: its derivative p (1 - p)
"""
_CE_BODY = """        dlogits = self.p.clone()  # (N, C)
        dlogits[torch.arange(n), self.target] -= 1  # p - onehot(target)
        dlogits /= n  # the loss is a mean over the batch
"""
_LSTM_DA = "da = torch.cat([di * i * (1 - i), df * f * (1 - f), dg * (1 - g ** 2), do * o * (1 - o)], dim=1)"
_BN_DX = "dx = self.rstd / n * (n * dxhat - dxhat.sum(0) - self.xhat * (dxhat * self.xhat).sum(0))"
_LN_DX = """dx = self.rstd / d * (d * dxhat - dxhat.sum(1, keepdim=True)
                              - self.xhat * (dxhat * self.xhat).sum(1, keepdim=True))"""
_POOL = "dx[:, :, i * s:i * s + k, j * s:j * s + k] += (winner * dout[:, :, i, j, None]).view(n, c, k, k)"
_CONV_DX = 'dxp[:, :, i:i + ho, j:j + wo] += torch.einsum("nohw,oc->nchw", dout, self.weight[:, :, i, j])'

# (exercise, [(text of the solution, what the learner wrote instead), ...], the mistake the checker must name)
WRONG = [
    # -- any layer: accumulation and in-place changes
    ("linear", [("p.grad += g  # accumulate, as PyTorch does", "p.grad = g")], "grad-overwritten"),
    ("linear", [("    p.grad = torch.zeros_like(p)\n", "    p.grad = g.clone()\n")], "grad-doubled"),
    ("batchnorm", [(_GRAD_INIT, "")], "grad-none-not-created"),
    ("relu", [("dx = dout * self.mask", "dout[~self.mask] = 0\n        dx = dout")], "dout-changed-in-place"),
    ("relu", [("out = x * self.mask", "x[~self.mask] = 0\n        out = x")], "input-changed-in-place"),
    (
        "linear",
        [("dbias = dout.sum(0)", "dbias = dout.sum(0)\n        self.x.zero_()  # done with the cache")],
        "input-changed-in-place",
    ),
    # -- linear
    ("linear", [("dbias = dout.sum(0)", "dbias = dout.mean(0)")], "bias-mean"),
    ("linear", [("dbias = dout.sum(0)", "dbias = dout")], "bias-not-summed"),
    ("linear", [("dweight = dout.T @ self.x", "dweight = self.x.T @ dout")], "weight-transposed"),
    ("linear", [("dweight = dout.T @ self.x", "dweight = dout.T @ self.x / len(self.x)")], "weight-mean"),
    # -- relu, sigmoid, tanh
    ("relu", [("dx = dout * self.mask", "dx = dout * ~self.mask")], "relu-mask-inverted"),
    ("relu", [("dx = dout * self.mask", "dx = dout * (dout > 0)")], "relu-mask-from-dout"),
    (
        "relu",
        [
            ("self.mask = x > 0", "self.mask = x > 0\n        self.x = x"),
            ("dx = dout * self.mask", "dx = dout * self.x"),
        ],
        "relu-times-x",
    ),
    (
        "relu",
        [
            ("out = x * self.mask", "out = x * self.mask\n        self.out = out"),
            ("dx = dout * self.mask", "dx = dout * self.out"),
        ],
        "relu-times-out",
    ),
    ("relu", [("dx = dout * self.mask", "dx = self.mask * 1.0")], "relu-no-dout"),
    ("sigmoid", [("dx = dout * s * (1 - s)", "dx = dout * s")], "sigmoid-no-one-minus"),
    (
        "sigmoid",
        [
            ("self.out = out", "self.out = out\n        self.x = x"),
            ("dx = dout * s * (1 - s)", "dx = dout * self.x * (1 - self.x)"),
        ],
        "sigmoid-of-input",
    ),
    ("sigmoid", [("s = self.out", "s = torch.sigmoid(self.out)")], "sigmoid-applied-twice"),
    ("sigmoid", [("dx = dout * s * (1 - s)", "dx = s * (1 - s)")], "sigmoid-no-dout"),
    (
        "tanh",
        [
            ("self.out = out", "self.out = out\n        self.x = x"),
            ("dx = dout * (1 - self.out ** 2)", "dx = dout * (1 - self.x ** 2)"),
        ],
        "tanh-of-input",
    ),
    (
        "tanh",
        [("dx = dout * (1 - self.out ** 2)", "dx = dout * (1 - torch.tanh(self.out) ** 2)")],
        "tanh-applied-twice",
    ),
    ("tanh", [("dx = dout * (1 - self.out ** 2)", "dx = dout * (1 - self.out)")], "tanh-no-square"),
    ("tanh", [("dx = dout * (1 - self.out ** 2)", "dx = 1 - self.out ** 2")], "tanh-no-dout"),
    # -- mse, softmax_cross_entropy
    ("mse", [("dinput = 2 * self.diff / self.diff.numel()", "dinput = self.diff / self.diff.numel()")], "mse-no-two"),
    ("mse", [("dinput = 2 * self.diff / self.diff.numel()", "dinput = 2 * self.diff")], "mse-no-mean"),
    (
        "mse",
        [("dinput = 2 * self.diff / self.diff.numel()", "dinput = 2 * self.diff / len(self.diff)")],
        "mse-mean-over-rows",
    ),
    (
        "mse",
        [("dinput = 2 * self.diff / self.diff.numel()", "dinput = 2 * -self.diff / self.diff.numel()")],
        "mse-sign",
    ),
    ("mse", [("loss = (self.diff ** 2).mean()", "loss = (self.diff ** 2).sum()")], "mse-sum"),
    (
        "softmax_cross_entropy",
        [("        dlogits[torch.arange(n), self.target] -= 1  # p - onehot(target)\n", "")],
        "ce-no-onehot",
    ),
    ("softmax_cross_entropy", [("        dlogits /= n  # the loss is a mean over the batch\n", "")], "ce-no-mean"),
    ("softmax_cross_entropy", [(_CE_BODY, _DIAGONAL_CE)], "ce-diagonal-jacobian"),
    ("softmax_cross_entropy", [("-= 1  # p - onehot(target)", "-= 1\n        dlogits = -dlogits")], "ce-sign"),
    ("softmax_cross_entropy", [("target].mean()", "target].sum()")], "ce-sum"),
    ("softmax_cross_entropy", [("loss = -logp[", "loss = -self.p[")], "ce-no-log"),
    # -- batchnorm, layernorm
    ("batchnorm", [(_BN_DX, "dx = dxhat * self.rstd")], "bn-stats-constant"),
    ("batchnorm", [(_BN_DX, "dx = self.rstd / n * (n * dxhat - dxhat.sum(0))")], "bn-var-constant"),
    (
        "batchnorm",
        [(_BN_DX, "dx = self.rstd / n * (n * dxhat - self.xhat * (dxhat * self.xhat).sum(0))")],
        "bn-mean-constant",
    ),
    ("batchnorm", [("var = ((x - mean) ** 2).mean(0)", "var = x.var(0)")], "bn-unbiased-var"),
    ("batchnorm", [("1 / torch.sqrt(var + self.eps)", "1 / (torch.sqrt(var) + self.eps)")], "bn-eps-outside-sqrt"),
    ("batchnorm", [("1 / torch.sqrt(var + self.eps)", "1 / torch.sqrt(var)")], "bn-no-eps"),
    (
        "batchnorm",
        [
            ("mean = x.mean(0)  # (D,)", "self.x = x\n        mean = x.mean(0)"),
            ("dweight = (dout * self.xhat).sum(0)", "dweight = (dout * self.x).sum(0)"),
        ],
        "bn-dweight-with-x",
    ),
    ("batchnorm", [("dweight = (dout * self.xhat).sum(0)", "dweight = dout.sum(0)")], "bn-dweight-is-dbias"),
    ("batchnorm", [("dbias = dout.sum(0)", "dbias = dout.mean(0)")], "bn-dbias-mean"),
    ("layernorm", [(_LN_DX, "dx = dxhat * self.rstd")], "ln-stats-constant"),
    (
        "layernorm",
        [
            ("x.mean(1, keepdim=True)", "x.mean(0, keepdim=True)"),
            ("** 2).mean(1, keepdim=True)", "** 2).mean(0, keepdim=True)"),
        ],
        "ln-over-batch",
    ),
    (
        "layernorm",
        [("var = ((x - mean) ** 2).mean(1, keepdim=True)", "var = x.var(1, keepdim=True)")],
        "ln-unbiased-var",
    ),
    (
        "layernorm",
        [("dweight = (dout * self.xhat).sum(0)", "dweight = (dout * self.xhat).sum(1)")],
        "ln-dweight-per-row",
    ),
    ("layernorm", [("dbias = dout.sum(0)", "dbias = dout.sum(1)")], "ln-dbias-per-row"),
    ("layernorm", [("dweight = (dout * self.xhat).sum(0)", "dweight = dout * self.xhat")], "ln-dweight-not-summed"),
    # -- embedding, conv2d, maxpool2d
    (
        "embedding",
        [
            (
                "dweight.index_add_(0, self.idx.reshape(-1), dout.reshape(-1, dout.shape[-1]))",
                "dweight[self.idx] += dout",
            )
        ],
        "emb-repeats-lost",
    ),
    ("conv2d", [(_CONV_DX, _CONV_DX.replace("[:, :, i, j]", "[:, :, k - 1 - i, k - 1 - j]"))], "conv-dx-flipped"),
    ("conv2d", [(_CONV_DX, _CONV_DX.replace("] +=", "] ="))], "conv-dx-overlap-assigned"),
    ("conv2d", [("dx = dxp[:, :, p:p + h, p:p + w]", "dx = dxp")], "conv-dx-padding-kept"),
    (
        "conv2d",
        [("dweight[:, :, i, j] = torch", "dweight[:, :, k - 1 - i, k - 1 - j] = torch")],
        "conv-dweight-flipped",
    ),
    ("conv2d", [("dbias = dout.sum((0, 2, 3))", "dbias = dout.sum(0)")], "conv-dbias-per-position"),
    ("maxpool2d", [(_POOL, _POOL.split("+=")[0] + "+= dout[:, :, i, j, None, None]")], "pool-whole-window"),
    ("maxpool2d", [(_POOL, _POOL.split("+=")[0] + "+= dout[:, :, i, j, None, None] / (k * k)")], "pool-average"),
    ("maxpool2d", [(_POOL, _POOL.replace("+=", "="))], "pool-overlap-assigned"),
    # -- lstm_cell
    (
        "lstm_cell",
        [
            (
                _LSTM_DA,
                "da = torch.cat([di * i * (1 - i), df * f * (1 - f), do * o * (1 - o), dg * (1 - g ** 2)], dim=1)",
            )
        ],
        "lstm-gates-ifog",
    ),
    ("lstm_cell", [("dc = dc_total * f", "dc = dc_total")], "lstm-forget-dropped"),
    ("lstm_cell", [("dc_total = dc_next + dh_next * o * (1 - tc ** 2)", "dc_total = dc_next")], "lstm-dh-not-into-c"),
    ("lstm_cell", [("(1 - tc ** 2)", "(1 - (f * c + i * g) ** 2)")], "lstm-tanh-of-c"),
    (
        "lstm_cell",
        [(_LSTM_DA, "da = torch.cat([di * i, df * f, dg * (1 - g ** 2), do * o], dim=1)")],
        "lstm-sigmoid-no-one-minus",
    ),
    ("lstm_cell", [("dh = da @ self.weight_hh", "dh = da @ self.weight_ih")], "lstm-dh-through-weight-ih"),
    # -- attention
    ("attention", [("scores = q @ k.transpose(1, 2) * self.scale", "scores = q @ k.transpose(1, 2)")], "attn-no-scale"),
    ("attention", [('scores.masked_fill(future, float("-inf"))', "scores")], "attn-no-mask"),
    (
        "attention",
        [
            ("dq = dscores @ self.k * self.scale", "dq = dscores @ self.k"),
            ("dk = dscores.transpose(1, 2) @ self.q * self.scale", "dk = dscores.transpose(1, 2) @ self.q"),
        ],
        "attn-scale-forward-only",
    ),
    (
        "attention",
        [
            (
                "dscores = self.att * (datt - (datt * self.att).sum(-1, keepdim=True))",
                "dscores = self.att * (1 - self.att) * datt",
            )
        ],
        "attn-diagonal-jacobian",
    ),
    ("attention", [("dk = dscores.transpose(1, 2) @ self.q", "dk = dscores @ self.q")], "attn-dk-not-transposed"),
    ("attention", [("dv = self.att.transpose(1, 2) @ dout", "dv = self.att @ dout")], "attn-dv-not-transposed"),
    # -- adam
    (
        "adam",
        [("m_hat = m / (1 - beta1 ** self.t)", "m_hat = m"), ("v_hat = v / (1 - beta2 ** self.t)", "v_hat = v")],
        "adam-no-bias-correction",
    ),
    ("adam", [("(v_hat.sqrt() + self.eps)", "(v_hat + self.eps).sqrt()")], "adam-eps-inside-sqrt"),
    (
        "adam",
        [
            (
                "            g = p.grad\n",
                "            g = p.grad\n            m, v = torch.zeros_like(p), torch.zeros_like(p)\n",
            )
        ],
        "adam-state-reset",
    ),
    ("adam", [("self.t += 1", "self.t = 1")], "adam-t-not-incremented"),
    ("adam", [("beta1, beta2 = self.betas", "beta2, beta1 = self.betas")], "adam-betas-swapped"),
    ("adam", [("p -= self.lr", "p += self.lr")], "adam-uphill"),
    ("adam", [("p -= self.lr", "p = p - self.lr")], "adam-not-in-place"),
    # -- mirrored into sibling exercises, and the wrong-axis, wrong-count, masked-diagonal, step-count-from-zero,
    #    shared-state and dropped-incoming-gradient families
    ("conv2d", [("dbias = dout.sum((0, 2, 3))", "dbias = dout.mean((0, 2, 3))")], "conv-dbias-mean"),
    (
        "lstm_cell",
        [("dc_total = dc_next + dh_next * o * (1 - tc ** 2)", "dc_total = dh_next * o * (1 - tc ** 2)")],
        "lstm-dc-next-dropped",
    ),
    ("lstm_cell", [("(1 - tc ** 2)", "(1 - torch.tanh(tc) ** 2)")], "lstm-tanh-applied-twice"),
    (
        "attention",
        [("torch.ones(t, t, dtype=torch.bool).triu(1)", "torch.ones(t, t, dtype=torch.bool).triu(0)")],
        "attn-mask-diagonal",
    ),
    ("attention", [('float("-inf")), dim=-1)', 'float("-inf")), dim=1)')], "attn-softmax-axis"),
    (
        "layernorm",
        [("dx = self.rstd / d * (d * dxhat - dxhat.sum(1, keepdim=True)\n", "dx = self.rstd / d * (d * dxhat\n")],
        "ln-mean-constant",
    ),
    (
        "layernorm",
        [("\n                              - self.xhat * (dxhat * self.xhat).sum(1, keepdim=True))", ")")],
        "ln-var-constant",
    ),
    ("layernorm", [("d = dout.shape[1]", "d = dout.shape[0]")], "ln-count-batch"),
    ("layernorm", [("dbias = dout.sum(0)", "dbias = dout.mean(0)")], "ln-dbias-mean"),
    ("batchnorm", [("n = dout.shape[0]", "n = dout.shape[1]")], "bn-count-features"),
    (
        "softmax_cross_entropy",
        [
            ("logits.max(1, keepdim=True)", "logits.max(0, keepdim=True)"),
            ("shifted.exp().sum(1, keepdim=True)", "shifted.exp().sum(0, keepdim=True)"),
        ],
        "ce-softmax-axis",
    ),
    (
        "adam",
        [
            ("        self.t += 1\n", ""),
            (
                "            p -= self.lr * m_hat / (v_hat.sqrt() + self.eps)\n",
                "            p -= self.lr * m_hat / (v_hat.sqrt() + self.eps)\n        self.t += 1\n",
            ),
        ],
        "adam-t-from-zero",
    ),
    (
        "adam",
        [
            (
                "        self.m = [torch.zeros_like(p) for p in self.params]\n"
                "        self.v = [torch.zeros_like(p) for p in self.params]\n",
                "        self.m = self.v = [torch.zeros_like(p) for p in self.params]\n",
            )
        ],
        "adam-shared-state",
    ),
    # -- value
    ("value", [(_VALUE_WALK, _PREORDER)], "value-walk-preorder"),
    ("value", [(_VALUE_WALK, _BFS)], "value-walk-bfs"),
    ("value", [(_VALUE_WALK, _RECURSIVE_WALK)], "value-walk-recursive"),
    ("value", [("for node in reversed(order):", "for node in order:")], "value-walk-not-reversed"),
    (
        "value",
        [
            (
                "self.grad += other.data * out.grad\n            other.grad += self.data * out.grad",
                "self.grad = other.data * out.grad\n            other.grad = self.data * out.grad",
            )
        ],
        "value-grad-overwritten",
    ),
    ("value", [("        self.grad = 1.0\n        for node", "        for node")], "value-no-seed"),
    (
        "value",
        [
            (
                "self.grad += other.data * out.grad\n            other.grad += self.data * out.grad",
                "self.grad += self.data * out.grad\n            other.grad += other.data * out.grad",
            )
        ],
        "value-mul-own-data",
    ),
    (
        "value",
        [("self.grad += (1 - t ** 2) * out.grad", "self.grad += (1 - self.data ** 2) * out.grad")],
        "value-tanh-of-input",
    ),
    ("value", [("n * self.data ** (n - 1)", "n * self.data ** n")], "value-pow-no-minus-one"),
    ("value", [("n * self.data ** (n - 1)", "self.data ** (n - 1)")], "value-pow-no-n"),
    ("value", [(_VALUE_WALK, _RECURSIVE_TOPO)], "value-recursion"),
    # -- tensor_parallel
    ("tensor_parallel", [("return xs  # every rank", "return all_reduce(xs)  #")], "tp-f-forward-all-reduce"),
    ("tensor_parallel", [("return all_reduce(dxs)", "return dxs")], "tp-f-backward-identity"),
    ("tensor_parallel", [("return all_reduce(parts)", "return parts")], "tp-g-forward-identity"),
    ("tensor_parallel", [("return douts  # each", "return all_reduce(douts)  #")], "tp-g-backward-all-reduce"),
    (
        "tensor_parallel",
        [
            (
                "outs = self.g.forward([x @ w.T for x, w in zip(xs, self.weights)])",
                "outs = self.g.forward([x @ w.T + self.bias for x, w in zip(xs, self.weights)])",
            ),
            ("return [out + self.bias for out in outs]", "return outs"),
        ],
        "tp-row-bias-every-rank",
    ),
    (
        "tensor_parallel",
        [("self.bias.grad += douts[0].sum(0)", "for dout in douts:\n            self.bias.grad += dout.sum(0)")],
        "tp-row-bias-grad-every-rank",
    ),
    ("tensor_parallel", [("shard(weight, 0, ranks)  # rows", "shard(weight, 1, ranks)  # rows")], "tp-wrong-axis"),
    (
        "tensor_parallel",
        [("shard(weight, 1, ranks)  # columns", "shard(weight, 0, ranks)  # columns")],
        "tp-wrong-axis",
    ),
    # -- ring_attention
    (
        "ring_attention",
        [("o = torch.exp(lse - new) * o + torch.exp(lse_b - new) * o_b", "o = o + torch.exp(lse_b - new) * o_b")],
        "ring-no-rescale",
    ),
    ("ring_attention", [("new = torch.logaddexp(lse, lse_b)", "new = torch.maximum(lse, lse_b)")], "ring-lse-max"),
    (
        "ring_attention",
        [
            (
                "p = torch.exp(qs[r] @ ks[b].transpose(1, 2) * self.scale - lses[r])",
                "p = torch.softmax(qs[r] @ ks[b].transpose(1, 2) * self.scale, -1)",
            ),
        ],
        "ring-block-lse",
    ),
    (
        "ring_attention",
        [
            (
                "dscores = p * (douts[r] @ vs[b].transpose(1, 2) - deltas[r])",
                "dscores = p * (douts[r] @ vs[b].transpose(1, 2))",
            )
        ],
        "ring-no-delta",
    ),
    (
        "ring_attention",
        [
            ("dvs[b] = dvs[b] + p.transpose(1, 2)", "dvs[b] = p.transpose(1, 2)"),
            ("dks[b] = dks[b] + dscores", "dks[b] = dscores"),
        ],
        "ring-dkv-overwritten",
    ),
    ("ring_attention", [("dqs[r] = dqs[r] + dscores", "dqs[r] = dscores")], "ring-dq-overwritten"),
    # -- moe_dispatch
    (
        "moe_dispatch",
        [("& kept).nonzero(as_tuple=True)  # (M,) each", ").nonzero(as_tuple=True)  #")],
        "moe-capacity-ignored",
    ),
    (
        "moe_dispatch",
        [("out.index_add_(0, tokens, gates[tokens, slots, None] * y)", "out.index_add_(0, tokens, y)")],
        "moe-gates-not-applied",
    ),
    ("moe_dispatch", [("dgates[tokens, slots] = (dout[tokens] * y).sum(-1)", "pass")], "moe-no-gate-grad"),
    (
        "moe_dispatch",
        [
            (
                "for e, (tokens, slots, y) in enumerate(self.routes):",
                "for e in range(self.n_experts):\n"
                "            tokens, slots = (self.experts == e).nonzero(as_tuple=True)\n"
                "            y = self.x[tokens] @ self.weight[e].T",
            ),
            ("self.x, self.gates = x, gates", "self.x, self.gates, self.experts = x, gates, experts"),
        ],
        "moe-dropped-get-gradient",
    ),
    (
        "moe_dispatch",
        [("dy = self.gates[tokens, slots, None] * dout[tokens]", "dy = dout[tokens]")],
        "moe-gate-forgotten-in-backward",
    ),
    (
        "moe_dispatch",
        [("dx.index_add_(0, tokens, dy @ self.weight[e])", "dx[tokens] = dy @ self.weight[e]")],
        "moe-topk-not-summed",
    ),
    # -- linear_split
    ("linear_split", [("self.pending = dout.clone()", "self.pending = dout.T @ self.x")], "split-dw-in-b"),
    (
        "linear_split",
        [("dx = dout @ self.weight  # (N, D): all", "self.backward_weight()\n        dx = dout @ self.weight  #")],
        "split-grad-in-b",
    ),
    ("linear_split", [("self.pending = dout.clone()", "self.pending = dout")], "split-dout-not-kept"),
    (
        "linear_split",
        [("        dout, self.pending = self.pending, None\n", "        dout = self.pending\n")],
        "split-w-twice",
    ),
    (
        "linear_split",
        [("for p, g in ((self.weight, dweight), (self.bias, dbias)):", "for p, g in ((self.weight, dweight),):")],
        "split-bias-forgotten",
    ),
    (
        "linear_split",
        [("dweight, dbias = dout.T @ self.x, dout.sum(0)", "dweight, dbias = dout.T @ self.x, dout.mean(0)")],
        "bias-mean",
    ),
    ("linear_split", [("p.grad += g  # accumulate: the", "p.grad = g  # accumulate: the")], "grad-overwritten"),
    # -- the generic families: a changed cache, an overflow, a saved tensor for another, a sum over another axis
    (
        "mse",
        [
            (
                "dinput = 2 * self.diff / self.diff.numel()",
                "self.diff *= 2\n        self.diff /= self.diff.numel()\n        dinput = self.diff",
            )
        ],
        "cache-changed-in-place",
    ),
    ("softmax_cross_entropy", [("dlogits = self.p.clone()", "dlogits = self.p")], "cache-changed-in-place"),
    (
        "tanh",
        [("out = torch.tanh(x)", "out = (torch.exp(x) - torch.exp(-x)) / (torch.exp(x) + torch.exp(-x))")],
        "exp-overflow",
    ),
    ("sigmoid", [("out = torch.sigmoid(x)", "out = torch.exp(x) / (1 + torch.exp(x))")], "exp-overflow"),
    (
        "lstm_cell",
        [
            (
                "di, df, dg = dc_total * g, dc_total * c, dc_total * i",
                "di, df, dg = dc_total * g, dc_total * (f * c + i * g), dc_total * i",
            )
        ],
        "wrong-saved-tensor",
    ),
    (
        "layernorm",
        [
            (
                "out = self.weight * self.xhat + self.bias  # (N, D)",
                "out = self.weight * self.xhat + self.bias  # (N, D)\n        self.out = out",
            ),
            ("dweight = (dout * self.xhat).sum(0)", "dweight = (dout * self.out).sum(0)"),
        ],
        "wrong-saved-tensor",
    ),
    ("layernorm", [("d * dxhat - dxhat.sum(1, keepdim=True)", "d * dxhat - dxhat.sum(0, keepdim=True)")], "wrong-axis"),
    (
        "attention",
        [("(datt * self.att).sum(-1, keepdim=True)", "(datt * self.att).sum(1, keepdim=True)")],
        "wrong-axis",
    ),
    # -- index-heavy: ties, swapped axes, sizes, strides
    (
        "maxpool2d",
        [
            (
                "out, self.arg = windows.reshape(*windows.shape[:4], k * k).max(-1)",
                "flat = windows.reshape(*windows.shape[:4], k * k)\n"
                "        out, self.arg = flat[..., 0].clone(), torch.zeros(flat.shape[:4], dtype=torch.long)\n"
                "        for t in range(1, k * k):\n            better = flat[..., t] >= out\n"
                "            out = torch.where(better, flat[..., t], out)\n"
                "            self.arg = torch.where(better, t, self.arg)\n        _ = None",
            )
        ],
        "pool-ties-last",
    ),
    (
        "maxpool2d",
        [
            (
                _POOL,
                "r, q = self.arg[:, :, i, j] % k, self.arg[:, :, i, j] // k\n"
                "                for b in range(n):\n                    for ch in range(c):\n"
                "                        dx[b, ch, i * s + r[b, ch], j * s + q[b, ch]] += dout[b, ch, i, j]",
            )
        ],
        "pool-unravel-swapped",
    ),
    (
        "maxpool2d",
        [
            (
                "windows = x.unfold(2, k, s).unfold(3, k, s)",
                "windows = x.unfold(2, k, s).unfold(3, k, s)[:, :, :(h - k) // s, :(w - k) // s]",
            )
        ],
        "pool-size-no-plus-one",
    ),
    (
        "maxpool2d",
        [("windows = x.unfold(2, k, s).unfold(3, k, s)", "windows = x.unfold(2, k, k).unfold(3, k, k)")],
        "pool-stride-as-kernel",
    ),
    (
        "conv2d",
        [
            (
                'dweight[:, :, i, j] = torch.einsum("nohw,nchw->oc", dout, patch)',
                'dweight[:, :, j, i] = torch.einsum("nohw,nchw->oc", dout, patch)',
            )
        ],
        "conv-dweight-offsets-swapped",
    ),
    (
        "conv2d",
        [("h, w = dxp.shape[2] - 2 * p, dxp.shape[3] - 2 * p", "h, w = dxp.shape[2] - p, dxp.shape[3] - p")],
        "conv-dx-cropped-one-side",
    ),
    ("attention", [("self.scale = d ** -0.5", "self.scale = 1 / d")], "attn-scale-one-over-d"),
    ("attention", [("dq = dscores @ self.k * self.scale", "dq = dscores @ self.k")], "attn-dq-no-scale"),
    (
        "attention",
        [("dk = dscores.transpose(1, 2) @ self.q * self.scale", "dk = dscores.transpose(1, 2) @ self.q")],
        "attn-dk-no-scale",
    ),
    # -- adam: the corrections, the square, the averages' weights, the step count
    ("adam", [("v_hat = v / (1 - beta2 ** self.t)", "v_hat = v")], "adam-v-not-corrected"),
    ("adam", [("p -= self.lr * m_hat /", "p -= self.lr * m /")], "adam-m-not-corrected"),
    ("adam", [("m_hat = m / (1 - beta1 ** self.t)", "m_hat = m / (1 - beta1) ** self.t")], "adam-power-outside"),
    (
        "adam",
        [("v.mul_(beta2).add_((1 - beta2) * g * g)", "v.mul_(beta2).add_((1 - beta2) * g)")],
        "adam-v-not-squared",
    ),
    (
        "adam",
        [("m.mul_(beta1).add_((1 - beta1) * g)", "m.mul_(1 - beta1).add_(beta1 * g)")],
        "adam-average-weights-swapped",
    ),
    (
        "adam",
        [
            ("        self.t += 1\n", ""),
            ("            g = p.grad\n", "            g = p.grad\n            self.t += 1\n"),
        ],
        "adam-t-per-parameter",
    ),
    # -- gelu
    ("gelu", [("dx = dout * (cdf + x * pdf)", "dx = dout * cdf")], "gelu-product-rule-half"),
    (
        "gelu",
        [("pdf = torch.exp(-0.5 * x ** 2) / math.sqrt(2 * math.pi)", "pdf = torch.exp(-0.5 * x ** 2)")],
        "gelu-pdf-unnormalised",
    ),
    (
        "gelu",
        [("out = 0.5 * x * (1 + torch.erf(x / math.sqrt(2)))", "out = 0.5 * x * (1 + torch.erf(x))")],
        "gelu-erf-no-sqrt2",
    ),
    (
        "gelu",
        [('if self.approximate == "tanh":\n            self.t', "if False:\n            self.t")],
        "gelu-approximate-ignored",
    ),
    ("gelu", [("0.5 * x * (1 - self.t ** 2) * du)", "0.5 * x * (1 - self.t ** 2))")], "gelu-tanh-chain-dropped"),
    ("gelu", [("(1 + 3 * 0.044715 * x ** 2)", "(1 + 0.044715 * x ** 2)")], "gelu-tanh-cube-no-three"),
    # -- broadcast
    (
        "broadcast",
        [
            (
                "        while g.dim() > len(shape):\n            g = g.sum(0)  # an axis broadcasting added in front\n"
                "        for axis, n in enumerate(shape):\n            if n == 1 and g.shape[axis] != 1:\n"
                "                g = g.sum(axis, keepdim=True)  # an axis of size 1, stretched\n",
                "",
            )
        ],
        "broadcast-not-summed",
    ),
    (
        "broadcast",
        [("g = g.sum(0)  #", "g = g.mean(0)  #"), ("g = g.sum(axis, keepdim=True)", "g = g.mean(axis, keepdim=True)")],
        "broadcast-mean",
    ),
    (
        "broadcast",
        [
            (
                "            if n == 1 and g.shape[axis] != 1:\n                g = g.sum(axis, keepdim=True)",
                "            if False:\n                g = g.sum(axis, keepdim=True)",
            )
        ],
        "broadcast-leading-only",
    ),
    (
        "broadcast",
        [
            (
                "        while g.dim() > len(shape):\n"
                "            g = g.sum(0)  # an axis broadcasting added in front\n",
                "        lead = g.dim() - len(shape)\n",
            ),
            (
                "            if n == 1 and g.shape[axis] != 1:\n                g = g.sum(axis, keepdim=True)",
                "            if n == 1 and g.shape[axis + lead] != 1:\n"
                "                g = g.sum(axis + lead, keepdim=True)",
            ),
        ],
        "broadcast-ones-only",
    ),
    (
        "broadcast",
        [
            (
                "        for axis, n in enumerate(shape):\n            if n == 1 and g.shape[axis] != 1:\n"
                "                g = g.sum(axis, keepdim=True)  # an axis of size 1, stretched\n",
                "        axes = tuple(a for a, n in enumerate(shape) if n == 1 and g.shape[a] != 1)\n"
                "        if axes:\n            g = g.sum(axes)\n",
            )
        ],
        "broadcast-no-keepdim",
    ),
    # -- accumulate
    (
        "accumulate",
        [("self.layer.backward(2 * diff / count)", "self.layer.backward(2 * diff / diff.numel())")],
        "accum-micro-mean",
    ),
    (
        "accumulate",
        [
            (
                "self.layer.backward(2 * diff / count)",
                "self.layer.backward(2 * diff / diff.numel() / -(-len(x) // self.micro_batch))",
            )
        ],
        "accum-averaged-over-micro-batches",
    ),
    (
        "accumulate",
        [
            (
                "            diff = self.layer.forward(xb) - tb",
                "            self.zero_grad()\n            diff = self.layer.forward(xb) - tb",
            )
        ],
        "accum-last-micro-batch-only",
    ),
    ("accumulate", [("self.layer.backward(2 * diff / count)", "self.layer.backward(2 * diff)")], "accum-not-divided"),
    (
        "accumulate",
        [
            ("            total = total + (diff ** 2).sum()", "            total = total + (diff ** 2).mean()"),
            ("        loss = total / count", "        loss = total / -(-len(x) // self.micro_batch)"),
        ],
        "accum-loss-mean-of-means",
    ),
    (
        "accumulate",
        [("        count = target.numel()", "        self.zero_grad()\n        count = target.numel()")],
        "accum-zeroed-inside",
    ),
    (
        "accumulate",
        [("        for p in self.parameters():\n            p.grad = None\n", "        pass\n")],
        "accum-zero-grad-noop",
    ),
    # -- dropout
    ("dropout", [("self.mask = keep / (1 - self.p) if", "self.mask = keep if")], "dropout-not-scaled"),
    (
        "dropout",
        [("self.mask = keep / (1 - self.p) if", "self.mask = keep * (1 - self.p) if")],
        "dropout-scaled-by-keep",
    ),
    ("dropout", [("self.mask = keep / (1 - self.p) if", "self.mask = keep / self.p if")], "dropout-p-as-keep"),
    (
        "dropout",
        [
            (
                "self.mask = keep / (1 - self.p) if self.p < 1 else torch.zeros_like(x)",
                "self.keep = keep\n        self.mask = keep / (1 - self.p) if self.p < 1 else torch.zeros_like(x)",
            ),
            (
                "dx = dout if self.mask is None else dout * self.mask",
                "dx = dout if self.mask is None else dout * self.keep",
            ),
        ],
        "dropout-backward-unscaled",
    ),
    ("dropout", [("dx = dout if self.mask is None else dout * self.mask", "dx = dout")], "dropout-backward-no-mask"),
    (
        "dropout",
        [
            (
                "dx = dout if self.mask is None else dout * self.mask",
                "keep = torch.empty_like(dout).bernoulli_(1 - self.p, generator=self.generator)\n"
                "        dx = dout if self.mask is None else dout * keep / (1 - self.p)",
            )
        ],
        "dropout-new-mask",
    ),
    # -- gru_cell
    (
        "gru_cell",
        [
            ("dn, dz = dh_next * (1 - z), dh_next * (h - n)", "dn, dz = dh_next * z, dh_next * (n - h)"),
            ("dh = dh_next * z + dgh", "dh = dh_next * (1 - z) + dgh"),
        ],
        "gru-update-gate-swapped",
    ),
    ("gru_cell", [("dr, dh_n = da_n * h_n, da_n * r", "dr, dh_n = da_n * h_n, da_n")], "gru-hn-without-r"),
    ("gru_cell", [("dh = dh_next * z + dgh @ self.weight_hh", "dh = dgh @ self.weight_hh")], "gru-direct-dropped"),
    (
        "gru_cell",
        [
            ("dgi = torch.cat([da_r, da_z, da_n], dim=1)", "dgi = torch.cat([da_z, da_r, da_n], dim=1)"),
            ("dgh = torch.cat([da_r, da_z, dh_n], dim=1)", "dgh = torch.cat([da_z, da_r, dh_n], dim=1)"),
        ],
        "gru-gates-zrn",
    ),
    ("gru_cell", [("dh_next * (h - n)", "dh_next * (n - h)")], "gru-dz-sign"),
    (
        "gru_cell",
        [("da_r, da_z = dr * r * (1 - r), dz * z * (1 - z)", "da_r, da_z = dr * r, dz * z")],
        "gru-sigmoid-no-one-minus",
    ),
    # -- sgd_momentum
    (
        "sgd_momentum",
        [
            ("self.buf[k] = d.clone()", "self.buf[k] = (1 - self.momentum) * d"),
            (
                "self.buf[k].mul_(self.momentum).add_(d)",
                "self.buf[k].mul_(self.momentum).add_((1 - self.momentum) * d)",
            ),
        ],
        "sgd-momentum-dampened",
    ),
    ("sgd_momentum", [("if self.buf[k] is None:", "if True:")], "sgd-buffer-not-kept"),
    (
        "sgd_momentum",
        [("d = d + self.momentum * self.buf[k] if self.nesterov else self.buf[k]", "d = self.buf[k]")],
        "sgd-nesterov-ignored",
    ),
    (
        "sgd_momentum",
        [("d = d + self.momentum * self.buf[k] if self.nesterov", "d = self.momentum * self.buf[k] if self.nesterov")],
        "sgd-nesterov-no-gradient",
    ),
    ("sgd_momentum", [("p -= self.lr * d", "p += self.lr * d")], "sgd-uphill"),
    ("sgd_momentum", [("p -= self.lr * d", "p = p - self.lr * d")], "sgd-not-in-place"),
    # -- rmsprop
    ("rmsprop", [("(v.sqrt() + self.eps)", "(v + self.eps).sqrt()")], "rmsprop-eps-inside-sqrt"),
    (
        "rmsprop",
        [("v.mul_(self.alpha).add_((1 - self.alpha) * g * g)", "v.mul_(1 - self.alpha).add_(self.alpha * g * g)")],
        "rmsprop-alpha-swapped",
    ),
    ("rmsprop", [("add_((1 - self.alpha) * g * g)", "add_((1 - self.alpha) * g)")], "rmsprop-not-squared"),
    ("rmsprop", [("(v.sqrt() + self.eps)", "(v + self.eps)")], "rmsprop-no-sqrt"),
    (
        "rmsprop",
        [
            (
                "        for p, v in zip(self.params, self.v):\n",
                "        self.t = getattr(self, 't', 0) + 1\n        for p, v in zip(self.params, self.v):\n",
            ),
            ("(v.sqrt() + self.eps)", "((v / (1 - self.alpha ** self.t)).sqrt() + self.eps)"),
        ],
        "rmsprop-bias-corrected",
    ),
    (
        "rmsprop",
        [
            (
                "            v.mul_(self.alpha).add_((1 - self.alpha) * g * g)",
                "            if not v.any():\n                v += g * g\n            else:\n"
                "                v.mul_(self.alpha).add_((1 - self.alpha) * g * g)",
            )
        ],
        "rmsprop-started-at-g2",
    ),
    (
        "rmsprop",
        [("            g = p.grad\n", "            g = p.grad\n            v.zero_()\n")],
        "rmsprop-state-reset",
    ),
    ("rmsprop", [("p -= self.lr", "p += self.lr")], "rmsprop-uphill"),
    ("rmsprop", [("p -= self.lr", "p = p - self.lr")], "rmsprop-not-in-place"),
]


def learner_file(tmp_path, name: str, changes: list[tuple[str, str]]):
    """The worked solution of ``name`` with each change made exactly once, written where the learner keeps it."""
    path = tmp_path / f"{name}.py"
    text = solution_text(get(name), str(path))
    for old, new in changes:
        assert text.count(old) == 1, f"{old!r} occurs {text.count(old)} times in the {name} solution"
        text = text.replace(old, new)
    path.write_text(text)
    return path


@pytest.mark.parametrize("name, changes, key", WRONG, ids=[key for _, _, key in WRONG])
def test_the_mistake_is_caught_and_named(tmp_path, name, changes, key):
    report = check_path(name, learner_file(tmp_path, name, changes))
    text = report.text()
    assert not report.passed and "FAIL" in text and "Traceback" not in text
    assert key in report.named, text


def test_every_catalogued_mistake_has_its_wrong_answer():
    tested = {key for _, _, key in WRONG}
    missing = [m.key for _, m in catalogue() if m.key not in tested]
    assert not missing, f"no wrong answer in WRONG names {missing}"
    assert len(catalogue()) >= 30

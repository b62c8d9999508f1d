"""Wrong answers written as a learner writes them, for the checker's verdict tests (tests/test_learn_verdicts.py).

WRONG_ANSWERS: eighty-five, five per exercise of the first seventeen, not taken from the catalogue: (exercise,
kind, changes to the worked solution, the mistake's key the checker should name or None).  A key is given where
the catalogue has (or was grown to have) the mistake.  kind: "config" right for one configuration only; "near"
within about 1e-8 of right (float32 somewhere); "autograd" the gradient taken with autograd; "plain" an ordinary
wrong formula.

FRESH: honest mistakes by family, written before the checker knew them (a tanh from its exp definition, a backward
that changes its own cache, a walk in pre-order, the right formula on the wrong saved tensor, a sum over the wrong
axis, max pooling's ties and unravelled indices, a scale lost from one gradient, an optimizer's slips, the new
exercises' slips): (exercise, family, changes, the key the checker names, or None where it only locates the
mistake).  The rule for all of them: no wrong answer passes, and a name is given only when it is true; a mistake
the checker cannot name is located (the tensor, the worst entry, where to look), never misnamed.

    python -m tests.learn_wrong_answers      every wrong answer checked: how many are named, located, passed,
                                             named otherwise than expected (misnamed), and located where a name
                                             was expected
"""

AG = "torch.autograd.grad"

WRONG_ANSWERS = [
    # -- linear
    (
        "linear",
        "autograd",
        [
            (
                "        dx = dout @ self.weight  #",
                "        x_, w_, b_ = (t.clone().requires_grad_() "
                "for t in (self.x, self.weight, self.bias))\n"
                f"        dx, dweight, dbias = {AG}(x_ @ w_.T + b_, "
                "(x_, w_, b_), dout)\n        _ = dout @ self.weight  #",
            ),
            ("        dweight = dout.T @ self.x  #", "        # dweight = dout.T @ self.x  #"),
            ("        dbias = dout.sum(0)  #", "        # dbias = dout.sum(0)  #"),
        ],
        None,
    ),
    ("linear", "config", [("dbias = dout.sum(0)", "dbias = dout.squeeze().sum(0)")], None),
    ("linear", "near", [("dweight = dout.T @ self.x ", "dweight = (dout.T.float() @ self.x.float()).double() ")], None),
    ("linear", "plain", [("out = x @ self.weight.T + self.bias", "out = x @ self.weight.T")], None),
    ("linear", "plain", [("dbias = dout.sum(0)", "dbias = dout.sum(1)")], "wrong-axis"),
    # -- relu
    (
        "relu",
        "autograd",
        [
            ("self.mask = x > 0  #", "self.x = x\n        self.mask = x > 0  #"),
            (
                "dx = dout * self.mask",
                "x_ = self.x.clone().requires_grad_()\n        torch.relu(x_).backward(dout)\n        dx = x_.grad",
            ),
        ],
        None,
    ),
    ("relu", "config", [("self.mask = x > 0", "self.mask = x >= 0")], None),
    ("relu", "near", [("dx = dout * self.mask", "dx = (dout * self.mask).float().double()")], None),
    ("relu", "plain", [("dx = dout * self.mask", "dx = self.mask * dout.abs()")], None),
    ("relu", "plain", [("out = x * self.mask", "out = x\n        out[~self.mask] = 0")], "input-changed-in-place"),
    # -- sigmoid
    (
        "sigmoid",
        "autograd",
        [
            ("self.out = out", "self.out = out\n        self.x = x"),
            (
                "dx = dout * s * (1 - s)",
                f"x_ = self.x.clone().requires_grad_()\n        (dx,) = {AG}(torch.sigmoid(x_), x_, dout)",
            ),
        ],
        None,
    ),
    ("sigmoid", "plain", [("dx = dout * s * (1 - s)", "dx = dout * s * (1 + s)")], None),
    ("sigmoid", "near", [("dx = dout * s * (1 - s)", "dx = (dout * s * (1 - s)).float().double()")], None),
    ("sigmoid", "plain", [("dx = dout * s * (1 - s)", "dx = dout * (1 - s) ** 2")], None),
    ("sigmoid", "plain", [("dx = dout * s * (1 - s)", "dx = dout / (s * (1 - s))")], None),
    # -- tanh
    (
        "tanh",
        "autograd",
        [
            ("self.out = out", "self.out = out\n        self.x = x"),
            (
                "dx = dout * (1 - self.out ** 2)",
                "x_ = self.x.clone().requires_grad_()\n"
                "        torch.tanh(x_).backward(dout)\n        dx = x_.grad.clone()",
            ),
        ],
        None,
    ),
    ("tanh", "plain", [("dx = dout * (1 - self.out ** 2)", "dx = dout * (1 - self.out) ** 2")], None),
    ("tanh", "near", [("out = torch.tanh(x)", "out = torch.tanh(x.float()).double()")], None),
    (
        "tanh",
        "plain",
        [("dx = dout * (1 - self.out ** 2)", "dx = dout * (1 - torch.tanh(self.out) ** 2)")],
        "tanh-applied-twice",
    ),
    (
        "tanh",
        "plain",
        [("dx = dout * (1 - self.out ** 2)", "dx = dout / torch.cosh(self.out) ** 2")],
        "tanh-applied-twice",
    ),  # 1 / cosh(t)**2 = 1 - tanh(t)**2: the same mistake
    # -- mse
    (
        "mse",
        "autograd",
        [
            (
                "self.diff = input - target  # (N, C)",
                "self.diff = input - target  # (N, C)\n        self.input, self.target = input, target",
            ),
            (
                "dinput = 2 * self.diff / self.diff.numel()",
                "i_ = self.input.clone().requires_grad_()\n"
                f"        (dinput,) = {AG}(((i_ - self.target) ** 2).mean(), i_)",
            ),
        ],
        None,
    ),
    (
        "mse",
        "config",
        [("dinput = 2 * self.diff / self.diff.numel()", "dinput = 2 * self.diff / (len(self.diff) * 3)")],
        None,
    ),
    ("mse", "near", [("loss = (self.diff ** 2).mean()", "loss = (self.diff.float() ** 2).mean().double()")], None),
    (
        "mse",
        "plain",
        [("dinput = 2 * self.diff / self.diff.numel()", "dinput = 2 * self.diff.abs() / self.diff.numel()")],
        None,
    ),
    ("mse", "plain", [("loss = (self.diff ** 2).mean()", "loss = (self.diff ** 2).mean(0).sum()")], None),
    # -- softmax_cross_entropy
    (
        "softmax_cross_entropy",
        "autograd",
        [
            (
                "self.p, self.target = logp.exp(), target",
                "self.p, self.target, self.logits = logp.exp(), target, logits",
            ),
            (
                "        dlogits = self.p.clone()  # (N, C)\n",
                "        z = self.logits.clone().requires_grad_()\n"
                "        torch.nn.functional.cross_entropy(z, self.target).backward()\n"
                "        dlogits = z.grad.clone()\n",
            ),
            ("        dlogits[torch.arange(n), self.target] -= 1  # p - onehot(target)\n", ""),
            ("        dlogits /= n  # the loss is a mean over the batch\n", ""),
        ],
        None,
    ),
    (
        "softmax_cross_entropy",
        "config",
        [("shifted = logits - logits.max(1, keepdim=True).values", "shifted = logits")],
        "exp-overflow",
    ),
    (
        "softmax_cross_entropy",
        "plain",
        [
            (
                "logp = shifted - shifted.exp().sum(1, keepdim=True).log()",
                "logp = shifted - shifted.exp().sum(0, keepdim=True).log()",
            )
        ],
        None,
    ),
    (
        "softmax_cross_entropy",
        "near",
        [("self.p, self.target = logp.exp(), target", "self.p, self.target = logp.float().exp().double(), target")],
        None,
    ),
    ("softmax_cross_entropy", "plain", [("dlogits /= n", "dlogits /= self.p.shape[1]")], None),
    # -- batchnorm
    (
        "batchnorm",
        "autograd",
        [
            ("mean = x.mean(0)  # (D,)", "self.x = x\n        mean = x.mean(0)  # (D,)"),
            (
                "        dx = self.rstd / n * (n * dxhat - dxhat.sum(0) - self.xhat * (dxhat * self.xhat).sum(0))"
                "  # (N, D)\n",
                "        x_ = self.x.clone().requires_grad_()\n        m_ = x_.mean(0)\n"
                "        v_ = ((x_ - m_) ** 2).mean(0)\n"
                f"        (dx,) = {AG}(self.weight * (x_ - m_) / torch.sqrt(v_ + self.eps) + self.bias, x_, dout)\n",
            ),
        ],
        None,
    ),
    ("batchnorm", "config", [("n = dout.shape[0]", "n = dout.shape[1]")], "bn-count-features"),
    (
        "batchnorm",
        "near",
        [("self.rstd = 1 / torch.sqrt(var + self.eps)", "self.rstd = 1 / torch.sqrt((var + self.eps).float())")],
        None,
    ),
    (
        "batchnorm",
        "plain",
        [
            (
                "dx = self.rstd / n * (n * dxhat - dxhat.sum(0) - self.xhat * (dxhat * self.xhat).sum(0))",
                "dx = self.rstd * (dxhat - dxhat.mean(0) - self.xhat * (dxhat * self.xhat).sum(0))",
            )
        ],
        None,
    ),
    ("batchnorm", "plain", [("dweight = (dout * self.xhat).sum(0)", "dweight = (dout * self.xhat).mean(0)")], None),
    # -- layernorm
    (
        "layernorm",
        "autograd",
        [
            (
                "mean = x.mean(1, keepdim=True)  # (N, 1)",
                "self.x = x\n        mean = x.mean(1, keepdim=True)  # (N, 1)",
            ),
            (
                "        dx = self.rstd / d * (d * dxhat - dxhat.sum(1, keepdim=True)\n"
                "                              - self.xhat * (dxhat * self.xhat).sum(1, keepdim=True))  # (N, D)\n",
                "        x_ = self.x.clone().requires_grad_()\n"
                "        y_ = torch.nn.functional.layer_norm(x_, (d,), self.weight, self.bias, self.eps)\n"
                "        (dx,) = torch.autograd.grad(y_, x_, dout)\n",
            ),
        ],
        None,
    ),
    ("layernorm", "config", [("d = dout.shape[1]", "d = dout.shape[0]")], "ln-count-batch"),
    (
        "layernorm",
        "near",
        [("mean = x.mean(1, keepdim=True)", "mean = x.float().mean(1, keepdim=True).double()")],
        None,
    ),
    (
        "layernorm",
        "plain",
        [("dx = self.rstd / d * (d * dxhat - dxhat.sum(1, keepdim=True)\n", "dx = self.rstd / d * (d * dxhat\n")],
        "ln-mean-constant",
    ),
    ("layernorm", "plain", [("dbias = dout.sum(0)", "dbias = dout.sum(0) / len(dout)")], "ln-dbias-mean"),
    # -- embedding
    (
        "embedding",
        "autograd",
        [
            (
                "        dweight = torch.zeros_like(self.weight)  # (V, D)\n"
                "        dweight.index_add_(0, self.idx.reshape(-1), dout.reshape(-1, dout.shape[-1]))"
                "  # repeated ids add up\n",
                "        w_ = self.weight.clone().requires_grad_()\n"
                f"        (dweight,) = {AG}(w_[self.idx], w_, dout)\n",
            )
        ],
        None,
    ),
    ("embedding", "config", [("dout.reshape(-1, dout.shape[-1])", "dout.reshape(-1, 3)")], None),
    ("embedding", "near", [("self.weight.grad += dweight", "self.weight.grad += dweight.float()")], None),
    ("embedding", "plain", [("self.weight.grad += dweight", "self.weight.grad = dweight")], "grad-overwritten"),
    (
        "embedding",
        "plain",
        [("dout.reshape(-1, dout.shape[-1])", "dout.reshape(-1, dout.shape[-1]) / self.idx.numel()")],
        None,
    ),
    # -- conv2d
    (
        "conv2d",
        "autograd",
        [
            (
                "        dxp = torch.zeros_like(self.xp)  # (N, C_in, H + 2p, W + 2p)\n",
                "        xp_ = self.xp.clone().requires_grad_()\n"
                "        out_ = torch.nn.functional.conv2d(xp_, self.weight)\n"
                f"        (dxp,) = {AG}(out_, xp_, dout)\n        dxp = dxp.clone()\n",
            ),
            ("                dxp[:, :, i:i + ho, j:j + wo] +=", "                _ ="),
        ],
        None,
    ),
    ("conv2d", "config", [("dx = dxp[:, :, p:p + h, p:p + w]", "dx = dxp[:, :, p:-p, p:-p]")], None),
    (
        "conv2d",
        "config",
        [("h, w = dxp.shape[2] - 2 * p, dxp.shape[3] - 2 * p", "h, w = dxp.shape[2] - 2, dxp.shape[3] - 2")],
        None,
    ),
    (
        "conv2d",
        "near",
        [
            (
                'dweight[:, :, i, j] = torch.einsum("nohw,nchw->oc", dout, patch)',
                'dweight[:, :, i, j] = torch.einsum("nohw,nchw->oc", dout.float(), patch.float())',
            )
        ],
        None,
    ),
    ("conv2d", "plain", [("dbias = dout.sum((0, 2, 3))", "dbias = dout.mean((0, 2, 3))")], "conv-dbias-mean"),
    # -- maxpool2d
    (
        "maxpool2d",
        "autograd",
        [
            ("self.x_shape = x.shape", "self.x_shape = x.shape\n        self.x = x"),
            (
                "        dx = torch.zeros(self.x_shape, dtype=dout.dtype)  # (N, C, H, W)\n",
                "        x_ = self.x.clone().requires_grad_()\n"
                "        torch.nn.functional.max_pool2d(x_, k, s).backward(dout)\n        return x_.grad\n"
                "        dx = torch.zeros(self.x_shape, dtype=dout.dtype)  # (N, C, H, W)\n",
            ),
        ],
        None,
    ),
    (
        "maxpool2d",
        "config",
        [
            ("self.x_shape = x.shape", "self.x_shape = x.shape\n        self.x = x"),
            (
                "winner = torch.nn.functional.one_hot(self.arg[:, :, i, j], k * k).to(dout.dtype)  # (N, C, k*k)",
                "win = self.x[:, :, i * s:i * s + k, j * s:j * s + k].reshape(n, c, k * k)\n"
                "                winner = (win == win.max(-1, keepdim=True).values).to(dout.dtype)",
            ),
        ],
        None,
    ),
    (
        "maxpool2d",
        "config",
        [("dx[:, :, i * s:i * s + k, j * s:j * s + k] +=", "dx[:, :, i * k:i * k + k, j * k:j * k + k] +=")],
        None,
    ),
    ("maxpool2d", "near", [("(winner * dout[:, :, i, j, None])", "(winner * dout[:, :, i, j, None].float())")], None),
    (
        "maxpool2d",
        "plain",
        [("dx = torch.zeros(self.x_shape, dtype=dout.dtype)", "dx = torch.zeros(self.x_shape)")],
        None,
    ),
    # -- lstm_cell
    (
        "lstm_cell",
        "autograd",
        [
            (
                "        dx = da @ self.weight_ih  # (N, I)\n",
                "        a_ = (x @ self.weight_ih.T + self.bias_ih + h @ self.weight_hh.T + self.bias_hh)"
                ".requires_grad_()\n"
                "        ai, af, ag, ao = a_.chunk(4, 1)\n"
                "        cn = torch.sigmoid(af) * c + torch.sigmoid(ai) * torch.tanh(ag)\n"
                f"        (da,) = {AG}((torch.sigmoid(ao) * torch.tanh(cn), cn), a_, (dh_next, dc_next))\n"
                "        dx = da @ self.weight_ih  # (N, I)\n",
            )
        ],
        None,
    ),
    (
        "lstm_cell",
        "plain",
        [("dc_total = dc_next + dh_next * o * (1 - tc ** 2)", "dc_total = dh_next * o * (1 - tc ** 2)")],
        "lstm-dc-next-dropped",
    ),
    ("lstm_cell", "near", [("dx = da @ self.weight_ih", "dx = (da.float() @ self.weight_ih.float()).double()")], None),
    (
        "lstm_cell",
        "plain",
        [
            (
                "dc_total = dc_next + dh_next * o * (1 - tc ** 2)",
                "dc_total = dc_next + dh_next * o * (1 - torch.tanh(tc) ** 2)",
            )
        ],
        "lstm-tanh-applied-twice",
    ),
    ("lstm_cell", "plain", [("do = dh_next * tc", "do = dh_next * tc * o * (1 - o)")], None),
    # -- attention
    (
        "attention",
        "autograd",
        [
            (
                "        dq = dscores @ self.k * self.scale  # (N, T, d)\n",
                "        q_, k_ = self.q.clone().requires_grad_(), self.k.clone().requires_grad_()\n"
                "        s_ = q_ @ k_.transpose(1, 2) * self.scale\n"
                f"        dq, dk = {AG}(s_, (q_, k_), dscores)\n",
            ),
            ("        dk = dscores.transpose(1, 2) @ self.q * self.scale  # (N, T, d)\n", ""),
        ],
        None,
    ),
    (
        "attention",
        "config",
        [
            (
                'att = torch.softmax(scores.masked_fill(future, float("-inf")), dim=-1)',
                'e = scores.masked_fill(future, float("-inf")).exp()\n        att = e / e.sum(-1, keepdim=True)',
            )
        ],
        "exp-overflow",
    ),
    ("attention", "config", [("self.scale = d ** -0.5", "self.scale = 3 ** -0.5")], None),
    (
        "attention",
        "near",
        [("out = att @ v  # (N, T, d)", "out = (att.float() @ v.float()).double()  # (N, T, d)")],
        None,
    ),
    (
        "attention",
        "plain",
        [
            (
                "future = torch.ones(t, t, dtype=torch.bool).triu(1)",
                "future = torch.ones(t, t, dtype=torch.bool).triu(0)",
            )
        ],
        "attn-mask-diagonal",
    ),
    # -- adam
    (
        "adam",
        "autograd",
        [
            (
                "        beta1, beta2 = self.betas\n",
                "        if not hasattr(self, 'inner'):\n"
                "            self.inner = torch.optim.Adam(self.params, lr=self.lr, betas=self.betas, eps=self.eps)\n"
                "        self.inner.step()\n        return\n        beta1, beta2 = self.betas\n",
            )
        ],
        None,
    ),
    (
        "adam",
        "near",
        [
            (
                "self.m = [torch.zeros_like(p) for p in self.params]",
                "self.m = [torch.zeros(p.shape) for p in self.params]",
            ),
            (
                "self.v = [torch.zeros_like(p) for p in self.params]",
                "self.v = [torch.zeros(p.shape) for p in self.params]",
            ),
        ],
        None,
    ),
    (
        "adam",
        "config",
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
        "plain",
        [
            (
                "        self.m = [torch.zeros_like(p) for p in self.params]\n"
                "        self.v = [torch.zeros_like(p) for p in self.params]\n",
                "        self.m = self.v = [torch.zeros_like(p) for p in self.params]\n",
            )
        ],
        "adam-shared-state",
    ),
    (
        "adam",
        "plain",
        [("p -= self.lr * m_hat / (v_hat.sqrt() + self.eps)", "p -= self.lr * m_hat / v_hat.sqrt() + self.eps")],
        None,
    ),
    # -- linear_split
    (
        "linear_split",
        "autograd",
        [
            (
                "dweight, dbias = dout.T @ self.x, dout.sum(0)",
                "w_ = self.weight.clone().requires_grad_()\n"
                f"        (dweight,) = {AG}(self.x @ w_.T, w_, dout)\n        dbias = dout.sum(0)",
            )
        ],
        None,
    ),
    (
        "linear_split",
        "config",
        [("dweight, dbias = dout.T @ self.x, dout.sum(0)", "dweight, dbias = dout.T @ self.x, dout.squeeze().sum(0)")],
        None,
    ),
    (
        "linear_split",
        "near",
        [("dx = dout @ self.weight  # (N, D): all", "dx = (dout.float() @ self.weight.float()).double()  #")],
        None,
    ),
    (
        "linear_split",
        "plain",
        [("dweight, dbias = dout.T @ self.x, dout.sum(0)", "dweight, dbias = dout.T @ self.x.abs(), dout.sum(0)")],
        None,
    ),
    (
        "linear_split",
        "plain",
        [("dx = dout @ self.weight  # (N, D): all", "dx = self.backward(dout)  #")],
        "split-grad-in-b",
    ),  # B running the fused backward: W's gradients added in B
    # -- tensor_parallel
    (
        "tensor_parallel",
        "autograd",
        [
            (
                "return self.f.backward([dy @ w for dy, w in zip(dys, self.weights)])",
                "parts = []\n        for dy, w, x in zip(dys, self.weights, self.xs):\n"
                "            x_ = x.clone().requires_grad_()\n"
                f"            parts += list({AG}(x_ @ w.T, x_, dy))\n        return self.f.backward(parts)",
            )
        ],
        None,
    ),
    ("tensor_parallel", "config", [("self.biases = shard(bias, 0, ranks)", "self.biases = shard(bias, 0, 3)")], None),
    ("tensor_parallel", "near", [("gw += dy.T @ x  # (H/T, D)", "gw += (dy.T.float() @ x.float()).double()  #")], None),
    ("tensor_parallel", "plain", [("gb += dy.sum(0)", "gb += dy.sum(0) / len(dy)")], None),
    (
        "tensor_parallel",
        "plain",
        [
            (
                "return self.f.backward([dy @ w for dy, w in zip(dys, self.weights)])",
                "return [dy @ w for dy, w in zip(dys, self.weights)]",
            )
        ],
        "tp-f-backward-identity",
    ),
    # -- value
    (
        "value",
        "autograd",
        [
            ("import math", "import math\nimport torch"),
            (
                "self.grad += (1 - t ** 2) * out.grad",
                "x_ = torch.tensor(self.data, requires_grad=True)\n"
                f"            (g_,) = {AG}(torch.tanh(x_), x_)\n            self.grad += g_.item() * out.grad",
            ),
        ],
        None,
    ),
    ("value", "plain", [("self.grad += e * out.grad", "self.grad += self.data * out.grad")], None),
    (
        "value",
        "near",
        [("self.grad += (1 - t ** 2) * out.grad", "self.grad += (1 - t ** 2) * out.grad * (1 + 1e-8)")],
        None,
    ),
    (
        "value",
        "plain",
        [
            (
                "            self.grad += out.grad\n            other.grad += out.grad\n",
                "            self.grad += out.grad\n",
            )
        ],
        None,
    ),
    (
        "value",
        "config",
        [
            (
                "        order, seen = [], set()\n        stack = [(self, False)]\n",
                "        order, seen = [], set()\n\n"
                "        def build(v):\n            if id(v) not in seen:\n                seen.add(id(v))\n"
                "                for p in v._prev:\n                    build(p)\n                order.append(v)\n"
                "        build(self)\n        stack = []\n",
            )
        ],
        "value-recursion",
    ),
]

FRESH = [
    # -- overflow
    (
        "tanh",
        "overflow",
        [
            ("out = torch.tanh(x)", "out = (torch.exp(x) - torch.exp(-x)) / (torch.exp(x) + torch.exp(-x))"),
        ],
        "exp-overflow",
    ),
    (
        "tanh",
        "overflow",
        [
            ("out = torch.tanh(x)", "e2 = torch.exp(2 * x)\n        out = (e2 - 1) / (e2 + 1)"),
        ],
        "exp-overflow",
    ),
    (
        "sigmoid",
        "overflow",
        [
            ("out = torch.sigmoid(x)", "out = torch.exp(x) / (1 + torch.exp(x))"),
        ],
        "exp-overflow",
    ),
    (
        "sigmoid",
        "overflow",
        [
            ("out = torch.sigmoid(x)", "e = torch.exp(-x)\n        out = 1 / (1 + e)\n        self.e = e"),
            ("dx = dout * s * (1 - s)", "dx = dout * self.e / (1 + self.e) ** 2"),
        ],
        "exp-overflow",
    ),
    (
        "softmax_cross_entropy",
        "overflow",
        [
            ("logp = shifted - shifted.exp().sum(1, keepdim=True).log()", "logp = torch.log(torch.softmax(logits, 1))"),
        ],
        "exp-overflow",
    ),
    (
        "attention",
        "overflow",
        [
            (
                'att = torch.softmax(scores.masked_fill(future, float("-inf")), dim=-1)',
                "e = (scores - scores.max()).exp().masked_fill(future, 0.0)\n        att = e / e.sum(-1, keepdim=True)",
            ),
        ],
        "exp-overflow",
    ),
    # -- cache
    (
        "mse",
        "cache",
        [
            (
                "dinput = 2 * self.diff / self.diff.numel()",
                "self.diff *= 2\n        self.diff /= self.diff.numel()\n        dinput = self.diff",
            ),
        ],
        "cache-changed-in-place",
    ),
    (
        "softmax_cross_entropy",
        "cache",
        [
            ("dlogits = self.p.clone()", "dlogits = self.p"),
        ],
        "cache-changed-in-place",
    ),
    (
        "sigmoid",
        "cache",
        [
            ("dx = dout * s * (1 - s)", "s *= 1 - s\n        dx = dout * s"),
        ],
        "cache-changed-in-place",
    ),
    (
        "tanh",
        "cache",
        [
            ("dx = dout * (1 - self.out ** 2)", "self.out **= 2\n        dx = dout * (1 - self.out)"),
        ],
        "cache-changed-in-place",
    ),
    (
        "layernorm",
        "cache",
        [
            (
                "dx = self.rstd / d * (d * dxhat - dxhat.sum(1, keepdim=True)\n"
                "                              - self.xhat * (dxhat * self.xhat).sum(1, keepdim=True))",
                "self.xhat *= (dxhat * self.xhat).sum(1, keepdim=True)\n"
                "        dx = self.rstd / d * (d * dxhat - dxhat.sum(1, keepdim=True) - self.xhat)",
            ),
        ],
        "cache-changed-in-place",
    ),
    (
        "attention",
        "cache",
        [
            (
                "dscores = self.att * (datt - (datt * self.att).sum(-1, keepdim=True))",
                "dscores = self.att\n        dscores *= datt - (datt * self.att).sum(-1, keepdim=True)",
            ),
        ],
        "cache-changed-in-place",
    ),
    (
        "lstm_cell",
        "cache",
        [
            ("dc_total = dc_next + dh_next * o * (1 - tc ** 2)", "dc_total = dc_next + dh_next * o * (1 - tc.pow_(2))"),
        ],
        "cache-changed-in-place",
    ),
    (
        "batchnorm",
        "cache",
        [
            ("dweight = (dout * self.xhat).sum(0)", "self.xhat *= dout\n        dweight = self.xhat.sum(0)"),
            ("- self.xhat * (dxhat * self.xhat).sum(0))", "- self.xhat / dout * (self.weight * self.xhat).sum(0))"),
        ],
        "cache-changed-in-place",
    ),
    # -- walk
    (
        "value",
        "walk",
        [
            (
                "            node, inputs_done = stack.pop()\n"
                "            if inputs_done:\n"
                "                order.append(node)\n"
                "            elif id(node) not in seen:\n"
                "                seen.add(id(node))\n"
                "                stack.append((node, True))\n"
                "                stack.extend((p, False) for p in node._prev if id(p) not in seen)\n"
                "        self.grad = 1.0\n"
                "        for node in reversed(order):",
                "            node, _ = stack.pop()\n"
                "            if id(node) not in seen:\n"
                "                seen.add(id(node))\n"
                "                order.append(node)\n"
                "                stack.extend((p, False) for p in node._prev)\n"
                "        self.grad = 1.0\n"
                "        for node in order:",
            ),
        ],
        "value-walk-preorder",
    ),
    (
        "value",
        "walk",
        [
            (
                "            node, inputs_done = stack.pop()\n"
                "            if inputs_done:\n"
                "                order.append(node)\n"
                "            elif id(node) not in seen:\n"
                "                seen.add(id(node))\n"
                "                stack.append((node, True))\n"
                "                stack.extend((p, False) for p in node._prev if id(p) not in seen)",
                "            node, inputs_done = stack.pop()\n"
                "            if inputs_done:\n"
                "                order.append(node)\n"
                "            else:\n"
                "                stack.append((node, True))\n"
                "                stack.extend((p, False) for p in node._prev)",
            ),
        ],
        "value-walk-recursive",
    ),
    (
        "value",
        "walk",
        [
            (
                "            node, inputs_done = stack.pop()\n"
                "            if inputs_done:\n"
                "                order.append(node)\n"
                "            elif id(node) not in seen:\n"
                "                seen.add(id(node))\n"
                "                stack.append((node, True))\n"
                "                stack.extend((p, False) for p in node._prev if id(p) not in seen)\n"
                "        self.grad = 1.0\n"
                "        for node in reversed(order):",
                "            node, _ = stack.pop()\n"
                "            if id(node) not in seen:\n"
                "                seen.add(id(node))\n"
                "                order.append(node)\n"
                "                stack.extend((p, False) for p in node._prev)\n"
                "        self.grad = 1.0\n"
                "        for node in reversed(order):",
            ),
        ],
        "value-walk-not-reversed",
    ),
    (
        "value",
        "walk",
        [
            (
                "            self.grad += out.grad\n            other.grad += out.grad\n",
                "            self.grad = out.grad\n            other.grad = out.grad\n",
            ),
        ],
        "value-grad-overwritten",
    ),
    # -- saved
    (
        "lstm_cell",
        "saved",
        [
            (
                "di, df, dg = dc_total * g, dc_total * c, dc_total * i",
                "di, df, dg = dc_total * g, dc_total * (f * c + i * g), dc_total * i",
            ),
        ],
        "wrong-saved-tensor",
    ),
    (
        "layernorm",
        "saved",
        [
            (
                "out = self.weight * self.xhat + self.bias  # (N, D)",
                "out = self.weight * self.xhat + self.bias  # (N, D)\n        self.out = out",
            ),
            ("dweight = (dout * self.xhat).sum(0)", "dweight = (dout * self.out).sum(0)"),
        ],
        "wrong-saved-tensor",
    ),
    (
        "batchnorm",
        "saved",
        [
            (
                "out = self.weight * self.xhat + self.bias  # (N, D)",
                "out = self.weight * self.xhat + self.bias  # (N, D)\n        self.out = out",
            ),
            ("dweight = (dout * self.xhat).sum(0)", "dweight = (dout * self.out).sum(0)"),
        ],
        "wrong-saved-tensor",
    ),
    (
        "batchnorm",
        "saved",
        [
            ("dxhat = dout * self.weight", "dxhat = dout * self.bias"),
        ],
        "wrong-saved-tensor",
    ),
    (
        "attention",
        "saved",
        [
            ("datt = dout @ self.v.transpose(1, 2)", "datt = dout @ self.q.transpose(1, 2)"),
        ],
        "wrong-saved-tensor",
    ),
    (
        "attention",
        "saved",
        [
            (
                "dk = dscores.transpose(1, 2) @ self.q * self.scale",
                "dk = dscores.transpose(1, 2) @ self.k * self.scale",
            ),
        ],
        "wrong-saved-tensor",
    ),
    (
        "lstm_cell",
        "saved",
        [
            ("do = dh_next * tc", "do = dh_next * torch.tanh(c)"),
        ],
        None,
    ),
    (
        "lstm_cell",
        "saved",
        [
            ("(self.weight_hh, da.T @ h)", "(self.weight_hh, da.T @ c)"),
        ],
        "wrong-saved-tensor",
    ),
    # -- axis
    (
        "layernorm",
        "axis",
        [
            ("d * dxhat - dxhat.sum(1, keepdim=True)", "d * dxhat - dxhat.sum(0, keepdim=True)"),
        ],
        "wrong-axis",
    ),
    (
        "layernorm",
        "axis",
        [
            (
                "- self.xhat * (dxhat * self.xhat).sum(1, keepdim=True))",
                "- self.xhat * (dxhat * self.xhat).sum(0, keepdim=True))",
            ),
        ],
        "wrong-axis",
    ),
    (
        "attention",
        "axis",
        [
            ("(datt * self.att).sum(-1, keepdim=True)", "(datt * self.att).sum(1, keepdim=True)"),
        ],
        "wrong-axis",
    ),
    (
        "batchnorm",
        "axis",
        [
            ("n * dxhat - dxhat.sum(0) -", "n * dxhat - dxhat.sum(1, keepdim=True) -"),
        ],
        "wrong-axis",
    ),
    (
        "softmax_cross_entropy",
        "axis",
        [
            (
                "shifted = logits - logits.max(1, keepdim=True).values",
                "shifted = logits - logits.max(0, keepdim=True).values",
            ),
        ],
        None,
    ),
    # -- index
    (
        "maxpool2d",
        "index",
        [
            (
                "out, self.arg = windows.reshape(*windows.shape[:4], k * k).max(-1)  # (N, C, H_out, W_out) each",
                "flat = windows.reshape(*windows.shape[:4], k * k)\n"
                "        out, self.arg = flat[..., 0].clone(), torch.zeros(flat.shape[:4], dtype=torch.long)\n"
                "        for t in range(1, k * k):\n"
                "            better = flat[..., t] >= out\n"
                "            out = torch.where(better, flat[..., t], out)\n"
                "            self.arg = torch.where(better, t, self.arg)",
            ),
        ],
        "pool-ties-last",
    ),
    (
        "maxpool2d",
        "index",
        [
            (
                "                winner = torch.nn.functional.one_hot(self.arg[:, :, i, j], k * k).to(dout.dtype)"
                "  # (N, C, k*k)\n"
                "                dx[:, :, i * s:i * s + k, j * s:j * s + k]"
                " += (winner * dout[:, :, i, j, None]).view(n, c, k, k)\n",
                "                a = self.arg[:, :, i, j]\n"
                "                r, q = a % k, a // k\n"
                "                for b in range(n):\n"
                "                    for ch in range(c):\n"
                "                        dx[b, ch, i * s + r[b, ch], j * s + q[b, ch]] += dout[b, ch, i, j]\n",
            ),
        ],
        "pool-unravel-swapped",
    ),
    (
        "maxpool2d",
        "index",
        [
            (
                "        windows = x.unfold(2, k, s).unfold(3, k, s)  # (N, C, H_out, W_out, k, k), views into x\n"
                "        out, self.arg = windows.reshape(*windows.shape[:4], k * k).max(-1)"
                "  # (N, C, H_out, W_out) each\n",
                "        ho, wo = (h - k) // s, (w - k) // s\n"
                "        out = torch.zeros(n, c, ho, wo, dtype=x.dtype)\n"
                "        self.arg = torch.zeros(n, c, ho, wo, dtype=torch.long)\n"
                "        for i in range(ho):\n"
                "            for j in range(wo):\n"
                "                win = x[:, :, i * s:i * s + k, j * s:j * s + k].reshape(n, c, k * k)\n"
                "                out[:, :, i, j], self.arg[:, :, i, j] = win.max(-1)\n",
            ),
        ],
        "pool-size-no-plus-one",
    ),
    (
        "maxpool2d",
        "index",
        [
            ("windows = x.unfold(2, k, s).unfold(3, k, s)", "windows = x.unfold(2, k, k).unfold(3, k, k)"),
        ],
        "pool-stride-as-kernel",
    ),
    (
        "embedding",
        "index",
        [
            (
                "        dweight.index_add_(0, self.idx.reshape(-1), dout.reshape(-1, dout.shape[-1]))"
                "  # repeated ids add up\n",
                "        for b in range(self.idx.shape[0]):\n"
                "            for t in range(self.idx.shape[1]):\n"
                "                dweight[self.idx[b, t]] = dout[b, t]\n",
            ),
        ],
        "emb-repeats-lost",
    ),
    (
        "embedding",
        "index",
        [
            (
                "dweight.index_add_(0, self.idx.reshape(-1), dout.reshape(-1, dout.shape[-1]))",
                "dweight.index_add_(0, self.idx.T.reshape(-1), dout.reshape(-1, dout.shape[-1]))",
            ),
        ],
        None,
    ),
    (
        "conv2d",
        "index",
        [
            (
                'dweight[:, :, i, j] = torch.einsum("nohw,nchw->oc", dout, patch)',
                'dweight[:, :, j, i] = torch.einsum("nohw,nchw->oc", dout, patch)',
            ),
        ],
        "conv-dweight-offsets-swapped",
    ),
    (
        "conv2d",
        "index",
        [
            ("h, w = dxp.shape[2] - 2 * p, dxp.shape[3] - 2 * p", "h, w = dxp.shape[2] - p, dxp.shape[3] - p"),
        ],
        "conv-dx-cropped-one-side",
    ),
    # -- scale
    (
        "attention",
        "scale",
        [
            ("dq = dscores @ self.k * self.scale", "dq = dscores @ self.k"),
        ],
        "attn-dq-no-scale",
    ),
    (
        "attention",
        "scale",
        [
            ("dk = dscores.transpose(1, 2) @ self.q * self.scale", "dk = dscores.transpose(1, 2) @ self.q"),
        ],
        "attn-dk-no-scale",
    ),
    (
        "attention",
        "scale",
        [
            ("self.scale = d ** -0.5", "self.scale = 1 / d"),
        ],
        "attn-scale-one-over-d",
    ),
    (
        "softmax_cross_entropy",
        "scale",
        [
            (
                "        dlogits = self.p.clone()  # (N, C)\n"
                "        dlogits[torch.arange(n), self.target] -= 1  # p - onehot(target)\n"
                "        dlogits /= n  # the loss is a mean over the batch\n",
                "        dlogits = self.p / n\n        dlogits[torch.arange(n), self.target] -= 1\n",
            ),
        ],
        None,
    ),
    (
        "batchnorm",
        "scale",
        [
            ("n = dout.shape[0]", "n = dout.shape[0] - 1"),
        ],
        None,
    ),
    (
        "conv2d",
        "scale",
        [
            ("dbias = dout.sum((0, 2, 3))", "dbias = dout.sum((0, 2, 3)) / (ho * wo)"),
        ],
        None,
    ),
    # -- optim
    (
        "adam",
        "optim",
        [
            ("v_hat = v / (1 - beta2 ** self.t)", "v_hat = v"),
        ],
        "adam-v-not-corrected",
    ),
    (
        "adam",
        "optim",
        [
            ("p -= self.lr * m_hat / (v_hat.sqrt() + self.eps)", "p -= self.lr * m / (v_hat.sqrt() + self.eps)"),
        ],
        "adam-m-not-corrected",
    ),
    (
        "adam",
        "optim",
        [
            ("m_hat = m / (1 - beta1 ** self.t)", "m_hat = m / (1 - beta1) ** self.t"),
        ],
        "adam-power-outside",
    ),
    (
        "adam",
        "optim",
        [
            ("v.mul_(beta2).add_((1 - beta2) * g * g)", "v.mul_(beta2).add_((1 - beta2) * g)"),
        ],
        "adam-v-not-squared",
    ),
    (
        "adam",
        "optim",
        [
            ("m.mul_(beta1).add_((1 - beta1) * g)", "m.mul_(1 - beta1).add_(beta1 * g)"),
        ],
        "adam-average-weights-swapped",
    ),
    (
        "adam",
        "optim",
        [
            ("        self.t += 1\n", ""),
            ("            g = p.grad\n", "            g = p.grad\n            self.t += 1\n"),
        ],
        "adam-t-per-parameter",
    ),
    # -- accumulate
    (
        "linear",
        "accumulate",
        [
            (
                "            if p.grad is None:\n                p.grad = torch.zeros_like(p)\n            p.grad += g",
                "            p.grad = torch.zeros_like(p)\n            p.grad += g",
            ),
        ],
        "grad-overwritten",
    ),
    (
        "lstm_cell",
        "accumulate",
        [
            (
                "(self.bias_ih, da.sum(0)), (self.bias_hh, da.sum(0))",
                "(self.bias_ih, da.sum(0) / 2), (self.bias_hh, da.sum(0) / 2)",
            ),
        ],
        None,
    ),
    (
        "conv2d",
        "accumulate",
        [
            ("param.grad += g", "param.grad += g if param is self.weight else 0 * g"),
        ],
        None,
    ),
    # -- plain
    (
        "lstm_cell",
        "plain",
        [
            ("dg * (1 - g ** 2)", "dg * g * (1 - g)"),
        ],
        None,
    ),
    (
        "lstm_cell",
        "plain",
        [
            ("dc = dc_total * f", "dc = dc_next * f"),
        ],
        None,
    ),
    (
        "linear",
        "plain",
        [
            ("dx = dout @ self.weight ", "dx = dout @ self.weight.T "),
        ],
        None,
    ),
    (
        "mse",
        "plain",
        [
            (
                "dinput = 2 * self.diff / self.diff.numel()",
                "dinput = 2 * self.diff.mean() * torch.ones_like(self.diff)",
            ),
        ],
        None,
    ),
    (
        "relu",
        "plain",
        [
            ("self.mask = x > 0", "self.mask = x > 0.0001"),
        ],
        None,
    ),
    (
        "embedding",
        "plain",
        [
            ("self.weight.grad += dweight", "self.weight.grad += dweight / self.idx.shape[0]"),
        ],
        None,
    ),
    (
        "layernorm",
        "plain",
        [
            ("dxhat = dout * self.weight", "dxhat = dout"),
        ],
        None,
    ),
    (
        "gelu",
        "plain",
        [
            ("dx = dout * (cdf + x * pdf)", "dx = dout * (cdf + pdf)"),
        ],
        None,
    ),
    (
        "gelu",
        "plain",
        [
            (
                "du = math.sqrt(2 / math.pi) * (1 + 3 * 0.044715 * x ** 2)",
                "du = math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)",
            ),
        ],
        None,
    ),
    # -- overflow
    (
        "gelu",
        "overflow",
        [
            (
                "self.t = torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3))  # tanh(u)",
                "u = math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)\n"
                "            self.t = (torch.exp(u) - torch.exp(-u)) / (torch.exp(u) + torch.exp(-u))",
            ),
        ],
        "exp-overflow",
    ),
    # -- cache
    (
        "gelu",
        "cache",
        [
            (
                "cdf = 0.5 * (1 + torch.erf(x / math.sqrt(2)))  # Phi(x)",
                "self.x *= 1.0\n            x = self.x\n            cdf = 0.5 * (1 + torch.erf(x / math.sqrt(2)))",
            ),
            ("dx = dout * (cdf + x * pdf)", "self.x += pdf\n            dx = dout * (cdf + (x - pdf) * pdf)"),
        ],
        "input-changed-in-place",
    ),
    # -- plain
    (
        "dropout",
        "plain",
        [
            (
                "self.mask = keep / (1 - self.p) if self.p < 1 else torch.zeros_like(x)",
                "self.mask = keep / (1 - self.p)",
            ),
        ],
        None,
    ),
    (
        "dropout",
        "plain",
        [
            ("out = x * self.mask", "out = x * keep"),
        ],
        "dropout-not-scaled",
    ),
    (
        "dropout",
        "plain",
        [
            ("dx = dout if self.mask is None else dout * self.mask", "dx = dout * (self.mask > 0)"),
        ],
        "dropout-backward-unscaled",
    ),
    # -- cache
    (
        "dropout",
        "cache",
        [
            (
                "dx = dout if self.mask is None else dout * self.mask",
                "if self.mask is None:\n            return dout\n        self.mask *= dout\n        dx = self.mask",
            ),
        ],
        "cache-changed-in-place",
    ),
    # -- axis
    (
        "broadcast",
        "axis",
        [
            ("            g = g.sum(0)  # an axis broadcasting added in front", "            g = g.sum(-1)"),
        ],
        None,
    ),
    # -- plain
    (
        "broadcast",
        "plain",
        [
            ("dscale = self.sum_to(dout * self.x, scale_shape)", "dscale = self.sum_to(dout, scale_shape)"),
        ],
        None,
    ),
    # -- saved
    (
        "broadcast",
        "saved",
        [
            ("dx = self.sum_to(dout * self.scale, x_shape)", "dx = self.sum_to(dout * self.x, x_shape)"),
        ],
        None,
    ),
    # -- accumulate
    (
        "accumulate",
        "accumulate",
        [
            ("self.layer.backward(2 * diff / count)", "self.layer.backward(2 * diff / (len(x) * diff.shape[1]) / 2)"),
        ],
        None,
    ),
    (
        "accumulate",
        "accumulate",
        [
            (
                "        for p in self.parameters():\n            p.grad = None\n",
                "        for p in self.parameters():\n            p.grad.zero_()\n",
            ),
        ],
        None,
    ),
    # -- plain
    (
        "accumulate",
        "plain",
        [
            ("        loss = total / count", "        loss = total / len(x)"),
        ],
        None,
    ),
    # -- saved
    (
        "gru_cell",
        "saved",
        [
            ("dr, dh_n = da_n * h_n, da_n * r", "dr, dh_n = da_n * h, da_n * r"),
        ],
        "wrong-saved-tensor",
    ),
    # -- plain
    (
        "gru_cell",
        "plain",
        [
            ("da_n = dn * (1 - n ** 2)", "da_n = dn * n * (1 - n)"),
        ],
        None,
    ),
    (
        "gru_cell",
        "plain",
        [
            ("(self.bias_hh, dgh.sum(0))", "(self.bias_hh, dgi.sum(0))"),
        ],
        None,
    ),
    # -- axis
    (
        "gru_cell",
        "axis",
        [
            ("(self.bias_ih, dgi.sum(0))", "(self.bias_ih, dgi.sum(0, keepdim=True))"),
        ],
        None,
    ),
    # -- optim
    (
        "sgd_momentum",
        "optim",
        [
            ("self.buf[k] = d.clone()", "self.buf[k] = d"),
        ],
        None,
    ),
    (
        "sgd_momentum",
        "optim",
        [
            (
                "d = d + self.momentum * self.buf[k] if self.nesterov else self.buf[k]",
                "d = d + self.momentum * self.buf[k] if self.nesterov else d + self.buf[k]",
            ),
        ],
        None,
    ),
    (
        "sgd_momentum",
        "optim",
        [
            (
                "p -= self.lr * d",
                "p -= self.lr * d\n"
                "            if self.momentum:\n"
                "                self.buf[k] = self.buf[k] * self.momentum",
            ),
        ],
        None,
    ),
    (
        "rmsprop",
        "optim",
        [
            ("p -= self.lr * g / (v.sqrt() + self.eps)", "p -= self.lr * g / v.sqrt() + self.eps"),
        ],
        None,
    ),
    (
        "rmsprop",
        "optim",
        [
            (
                "v.mul_(self.alpha).add_((1 - self.alpha) * g * g)",
                "v.mul_(self.alpha).add_((1 - self.alpha) * g.abs())",
            ),
        ],
        None,
    ),
    (
        "rmsprop",
        "optim",
        [
            ("p -= self.lr * g / (v.sqrt() + self.eps)", "p -= self.lr * g.sign()"),
        ],
        None,
    ),
]


def tally(rows) -> dict[str, int]:
    """Check every wrong answer of ``rows``: -> {"named", "located", "passed", "misnamed"}, and one line each."""
    import tempfile
    from pathlib import Path

    from learn.checker import check_path
    from learn.checker.load import LoadError
    from learn.checker.sandbox import Escaped
    from learn.exercises import get
    from learn.source import solution_text

    counts = {"named": 0, "located": 0, "passed": 0, "misnamed": 0, "not named as expected": 0}
    with tempfile.TemporaryDirectory() as folder:
        for k, (name, kind, changes, key) in enumerate(rows):
            path = Path(folder) / f"{name}.py"
            text = solution_text(get(name), str(path))
            for old, new in changes:
                text = text.replace(old, new)
            path.write_text(text)
            try:
                report = check_path(name, path)
                passed, named = report.passed, [n for n in report.named if n not in ("not-written", "recursion")]
            except (LoadError, Escaped):
                passed, named = False, []
            verdict = "passed" if passed else "named" if named else "located"
            counts[verdict] += 1
            if not passed and named != ([key] if key else []) and kind != "autograd":
                counts["misnamed" if named else "not named as expected"] += 1  # a name, not the true one
                verdict += f" (expected {key}, named {named})"
            print(f"{k:3d} {name:22} {kind:10} {verdict}")
    return counts


if __name__ == "__main__":
    for label, rows in (("WRONG_ANSWERS", WRONG_ANSWERS), ("FRESH", FRESH)):
        print(f"{label}: {len(rows)} wrong answers")
        print(f"{label}: {tally(rows)}")

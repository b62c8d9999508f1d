"""Eighty-five wrong answers written as a learner writes them, five per exercise, not taken from the catalogue.

Each is (exercise, kind, changes to the worked solution, the mistake's key the checker should name or None).
A key is given where the catalogue has (or was grown to have) the mistake.
kind: "config" right for one configuration only; "near" within about 1e-8 of right (float32 somewhere);
"autograd" the gradient taken with autograd; "plain" an ordinary wrong formula.
"""

AG = "torch.autograd.grad"

WRONG_ANSWERS = [
    # -- linear
    ("linear", "autograd", [("        dx = dout @ self.weight  #", "        x_, w_, b_ = (t.clone().requires_grad_() "
                                                                 "for t in (self.x, self.weight, self.bias))\n"
                                                                 f"        dx, dweight, dbias = {AG}(x_ @ w_.T + b_, "
                                                                 "(x_, w_, b_), dout)\n        _ = dout @ self.weight  #"),
                            ("        dweight = dout.T @ self.x  #", "        # dweight = dout.T @ self.x  #"),
                            ("        dbias = dout.sum(0)  #", "        # dbias = dout.sum(0)  #")], None),
    ("linear", "config", [("dbias = dout.sum(0)", "dbias = dout.squeeze().sum(0)")], None),
    ("linear", "near", [("dweight = dout.T @ self.x ", "dweight = (dout.T.float() @ self.x.float()).double() ")],
     None),
    ("linear", "plain", [("out = x @ self.weight.T + self.bias", "out = x @ self.weight.T")], None),
    ("linear", "plain", [("dbias = dout.sum(0)", "dbias = dout.sum(1)")], "wrong-axis"),
    # -- relu
    ("relu", "autograd", [("self.mask = x > 0  #", "self.x = x\n        self.mask = x > 0  #"),
                          ("dx = dout * self.mask", "x_ = self.x.clone().requires_grad_()\n"
                           "        torch.relu(x_).backward(dout)\n        dx = x_.grad")], None),
    ("relu", "config", [("self.mask = x > 0", "self.mask = x >= 0")], None),
    ("relu", "near", [("dx = dout * self.mask", "dx = (dout * self.mask).float().double()")], None),
    ("relu", "plain", [("dx = dout * self.mask", "dx = self.mask * dout.abs()")], None),
    ("relu", "plain", [("out = x * self.mask", "out = x\n        out[~self.mask] = 0")], "input-changed-in-place"),
    # -- sigmoid
    ("sigmoid", "autograd", [("self.out = out", "self.out = out\n        self.x = x"),
                             ("dx = dout * s * (1 - s)", "x_ = self.x.clone().requires_grad_()\n"
                              f"        (dx,) = {AG}(torch.sigmoid(x_), x_, dout)")], None),
    ("sigmoid", "plain", [("dx = dout * s * (1 - s)", "dx = dout * s * (1 + s)")], None),
    ("sigmoid", "near", [("dx = dout * s * (1 - s)", "dx = (dout * s * (1 - s)).float().double()")], None),
    ("sigmoid", "plain", [("dx = dout * s * (1 - s)", "dx = dout * (1 - s) ** 2")], None),
    ("sigmoid", "plain", [("dx = dout * s * (1 - s)", "dx = dout / (s * (1 - s))")], None),
    # -- tanh
    ("tanh", "autograd", [("self.out = out", "self.out = out\n        self.x = x"),
                          ("dx = dout * (1 - self.out ** 2)", "x_ = self.x.clone().requires_grad_()\n"
                           "        torch.tanh(x_).backward(dout)\n        dx = x_.grad.clone()")], None),
    ("tanh", "plain", [("dx = dout * (1 - self.out ** 2)", "dx = dout * (1 - self.out) ** 2")], None),
    ("tanh", "near", [("out = torch.tanh(x)", "out = torch.tanh(x.float()).double()")], None),
    ("tanh", "plain", [("dx = dout * (1 - self.out ** 2)", "dx = dout * (1 - torch.tanh(self.out) ** 2)")],
     "tanh-applied-twice"),
    ("tanh", "plain", [("dx = dout * (1 - self.out ** 2)", "dx = dout / torch.cosh(self.out) ** 2")],
     "tanh-applied-twice"),  # 1 / cosh(t)**2 = 1 - tanh(t)**2: the same mistake
    # -- mse
    ("mse", "autograd", [("self.diff = input - target  # (N, C)", "self.diff = input - target  # (N, C)\n"
                          "        self.input, self.target = input, target"),
                         ("dinput = 2 * self.diff / self.diff.numel()", "i_ = self.input.clone().requires_grad_()\n"
                          f"        (dinput,) = {AG}(((i_ - self.target) ** 2).mean(), i_)")], None),
    ("mse", "config", [("dinput = 2 * self.diff / self.diff.numel()", "dinput = 2 * self.diff / (len(self.diff) * 3)")],
     None),
    ("mse", "near", [("loss = (self.diff ** 2).mean()", "loss = (self.diff.float() ** 2).mean().double()")], None),
    ("mse", "plain", [("dinput = 2 * self.diff / self.diff.numel()", "dinput = 2 * self.diff.abs() / self.diff.numel()")],
     None),
    ("mse", "plain", [("loss = (self.diff ** 2).mean()", "loss = (self.diff ** 2).mean(0).sum()")], None),
    # -- softmax_cross_entropy
    ("softmax_cross_entropy", "autograd",
     [("self.p, self.target = logp.exp(), target", "self.p, self.target, self.logits = logp.exp(), target, logits"),
      ("        dlogits = self.p.clone()  # (N, C)\n", "        z = self.logits.clone().requires_grad_()\n"
       "        torch.nn.functional.cross_entropy(z, self.target).backward()\n        dlogits = z.grad.clone()\n"),
      ("        dlogits[torch.arange(n), self.target] -= 1  # p - onehot(target)\n", ""),
      ("        dlogits /= n  # the loss is a mean over the batch\n", "")], None),
    ("softmax_cross_entropy", "config",
     [("shifted = logits - logits.max(1, keepdim=True).values", "shifted = logits")], "exp-overflow"),
    ("softmax_cross_entropy", "plain",
     [("logp = shifted - shifted.exp().sum(1, keepdim=True).log()", "logp = shifted - shifted.exp().sum(0, keepdim=True).log()")],
     None),
    ("softmax_cross_entropy", "near", [("self.p, self.target = logp.exp(), target",
                                        "self.p, self.target = logp.float().exp().double(), target")], None),
    ("softmax_cross_entropy", "plain", [("dlogits /= n", "dlogits /= self.p.shape[1]")], None),
    # -- batchnorm
    ("batchnorm", "autograd",
     [("mean = x.mean(0)  # (D,)", "self.x = x\n        mean = x.mean(0)  # (D,)"),
      ("        dx = self.rstd / n * (n * dxhat - dxhat.sum(0) - self.xhat * (dxhat * self.xhat).sum(0))  # (N, D)\n",
       "        x_ = self.x.clone().requires_grad_()\n        m_ = x_.mean(0)\n"
       "        v_ = ((x_ - m_) ** 2).mean(0)\n"
       f"        (dx,) = {AG}(self.weight * (x_ - m_) / torch.sqrt(v_ + self.eps) + self.bias, x_, dout)\n")], None),
    ("batchnorm", "config", [("n = dout.shape[0]", "n = dout.shape[1]")], "bn-count-features"),
    ("batchnorm", "near", [("self.rstd = 1 / torch.sqrt(var + self.eps)",
                            "self.rstd = 1 / torch.sqrt((var + self.eps).float())")], None),
    ("batchnorm", "plain", [("dx = self.rstd / n * (n * dxhat - dxhat.sum(0) - self.xhat * (dxhat * self.xhat).sum(0))",
                             "dx = self.rstd * (dxhat - dxhat.mean(0) - self.xhat * (dxhat * self.xhat).sum(0))")],
     None),
    ("batchnorm", "plain", [("dweight = (dout * self.xhat).sum(0)", "dweight = (dout * self.xhat).mean(0)")], None),
    # -- layernorm
    ("layernorm", "autograd",
     [("mean = x.mean(1, keepdim=True)  # (N, 1)", "self.x = x\n        mean = x.mean(1, keepdim=True)  # (N, 1)"),
      ("        dx = self.rstd / d * (d * dxhat - dxhat.sum(1, keepdim=True)\n"
       "                              - self.xhat * (dxhat * self.xhat).sum(1, keepdim=True))  # (N, D)\n",
       "        x_ = self.x.clone().requires_grad_()\n"
       "        y_ = torch.nn.functional.layer_norm(x_, (d,), self.weight, self.bias, self.eps)\n"
       "        (dx,) = torch.autograd.grad(y_, x_, dout)\n")], None),
    ("layernorm", "config", [("d = dout.shape[1]", "d = dout.shape[0]")], "ln-count-batch"),
    ("layernorm", "near", [("mean = x.mean(1, keepdim=True)", "mean = x.float().mean(1, keepdim=True).double()")],
     None),
    ("layernorm", "plain", [("dx = self.rstd / d * (d * dxhat - dxhat.sum(1, keepdim=True)\n",
                             "dx = self.rstd / d * (d * dxhat\n")], "ln-mean-constant"),
    ("layernorm", "plain", [("dbias = dout.sum(0)", "dbias = dout.sum(0) / len(dout)")], "ln-dbias-mean"),
    # -- embedding
    ("embedding", "autograd",
     [("        dweight = torch.zeros_like(self.weight)  # (V, D)\n"
       "        dweight.index_add_(0, self.idx.reshape(-1), dout.reshape(-1, dout.shape[-1]))  # repeated ids add up\n",
       "        w_ = self.weight.clone().requires_grad_()\n"
       f"        (dweight,) = {AG}(w_[self.idx], w_, dout)\n")], None),
    ("embedding", "config", [("dout.reshape(-1, dout.shape[-1])", "dout.reshape(-1, 3)")], None),
    ("embedding", "near", [("self.weight.grad += dweight", "self.weight.grad += dweight.float()")], None),
    ("embedding", "plain", [("self.weight.grad += dweight", "self.weight.grad = dweight")], "grad-overwritten"),
    ("embedding", "plain", [("dout.reshape(-1, dout.shape[-1])", "dout.reshape(-1, dout.shape[-1]) / self.idx.numel()")],
     None),
    # -- conv2d
    ("conv2d", "autograd",
     [("        dxp = torch.zeros_like(self.xp)  # (N, C_in, H + 2p, W + 2p)\n",
       "        xp_ = self.xp.clone().requires_grad_()\n"
       "        out_ = torch.nn.functional.conv2d(xp_, self.weight)\n"
       f"        (dxp,) = {AG}(out_, xp_, dout)\n        dxp = dxp.clone()\n"),
      ("                dxp[:, :, i:i + ho, j:j + wo] +=", "                _ =")], None),
    ("conv2d", "config", [("dx = dxp[:, :, p:p + h, p:p + w]", "dx = dxp[:, :, p:-p, p:-p]")], None),
    ("conv2d", "config", [("h, w = dxp.shape[2] - 2 * p, dxp.shape[3] - 2 * p", "h, w = dxp.shape[2] - 2, dxp.shape[3] - 2")],
     None),
    ("conv2d", "near", [('dweight[:, :, i, j] = torch.einsum("nohw,nchw->oc", dout, patch)',
                         'dweight[:, :, i, j] = torch.einsum("nohw,nchw->oc", dout.float(), patch.float())')], None),
    ("conv2d", "plain", [("dbias = dout.sum((0, 2, 3))", "dbias = dout.mean((0, 2, 3))")], "conv-dbias-mean"),
    # -- maxpool2d
    ("maxpool2d", "autograd",
     [("self.x_shape = x.shape", "self.x_shape = x.shape\n        self.x = x"),
      ("        dx = torch.zeros(self.x_shape, dtype=dout.dtype)  # (N, C, H, W)\n",
       "        x_ = self.x.clone().requires_grad_()\n"
       "        torch.nn.functional.max_pool2d(x_, k, s).backward(dout)\n        return x_.grad\n"
       "        dx = torch.zeros(self.x_shape, dtype=dout.dtype)  # (N, C, H, W)\n")], None),
    ("maxpool2d", "config",
     [("self.x_shape = x.shape", "self.x_shape = x.shape\n        self.x = x"),
      ("winner = torch.nn.functional.one_hot(self.arg[:, :, i, j], k * k).to(dout.dtype)  # (N, C, k*k)",
       "win = self.x[:, :, i * s:i * s + k, j * s:j * s + k].reshape(n, c, k * k)\n"
       "                winner = (win == win.max(-1, keepdim=True).values).to(dout.dtype)")], None),
    ("maxpool2d", "config", [("dx[:, :, i * s:i * s + k, j * s:j * s + k] +=", "dx[:, :, i * k:i * k + k, j * k:j * k + k] +=")],
     None),
    ("maxpool2d", "near", [("(winner * dout[:, :, i, j, None])", "(winner * dout[:, :, i, j, None].float())")],
     None),
    ("maxpool2d", "plain", [("dx = torch.zeros(self.x_shape, dtype=dout.dtype)", "dx = torch.zeros(self.x_shape)")],
     None),
    # -- lstm_cell
    ("lstm_cell", "autograd",
     [("        dx = da @ self.weight_ih  # (N, I)\n",
       "        a_ = (x @ self.weight_ih.T + self.bias_ih + h @ self.weight_hh.T + self.bias_hh).requires_grad_()\n"
       "        ai, af, ag, ao = a_.chunk(4, 1)\n"
       "        cn = torch.sigmoid(af) * c + torch.sigmoid(ai) * torch.tanh(ag)\n"
       f"        (da,) = {AG}((torch.sigmoid(ao) * torch.tanh(cn), cn), a_, (dh_next, dc_next))\n"
       "        dx = da @ self.weight_ih  # (N, I)\n")], None),
    ("lstm_cell", "plain", [("dc_total = dc_next + dh_next * o * (1 - tc ** 2)", "dc_total = dh_next * o * (1 - tc ** 2)")],
     "lstm-dc-next-dropped"),
    ("lstm_cell", "near", [("dx = da @ self.weight_ih", "dx = (da.float() @ self.weight_ih.float()).double()")], None),
    ("lstm_cell", "plain", [("dc_total = dc_next + dh_next * o * (1 - tc ** 2)",
                             "dc_total = dc_next + dh_next * o * (1 - torch.tanh(tc) ** 2)")], "lstm-tanh-applied-twice"),
    ("lstm_cell", "plain", [("do = dh_next * tc", "do = dh_next * tc * o * (1 - o)")], None),
    # -- attention
    ("attention", "autograd",
     [("        dq = dscores @ self.k * self.scale  # (N, T, d)\n",
       "        q_, k_ = self.q.clone().requires_grad_(), self.k.clone().requires_grad_()\n"
       "        s_ = q_ @ k_.transpose(1, 2) * self.scale\n"
       f"        dq, dk = {AG}(s_, (q_, k_), dscores)\n"),
      ("        dk = dscores.transpose(1, 2) @ self.q * self.scale  # (N, T, d)\n", "")], None),
    ("attention", "config", [('att = torch.softmax(scores.masked_fill(future, float("-inf")), dim=-1)',
                              'e = scores.masked_fill(future, float("-inf")).exp()\n        att = e / e.sum(-1, keepdim=True)')],
     "exp-overflow"),
    ("attention", "config", [("self.scale = d ** -0.5", "self.scale = 3 ** -0.5")], None),
    ("attention", "near", [("out = att @ v  # (N, T, d)", "out = (att.float() @ v.float()).double()  # (N, T, d)")],
     None),
    ("attention", "plain", [("future = torch.ones(t, t, dtype=torch.bool).triu(1)",
                             "future = torch.ones(t, t, dtype=torch.bool).triu(0)")], "attn-mask-diagonal"),
    # -- adam
    ("adam", "autograd", [("        beta1, beta2 = self.betas\n",
                           "        if not hasattr(self, 'inner'):\n"
                           "            self.inner = torch.optim.Adam(self.params, lr=self.lr, betas=self.betas, eps=self.eps)\n"
                           "        self.inner.step()\n        return\n        beta1, beta2 = self.betas\n")], None),
    ("adam", "near", [("self.m = [torch.zeros_like(p) for p in self.params]", "self.m = [torch.zeros(p.shape) for p in self.params]"),
                      ("self.v = [torch.zeros_like(p) for p in self.params]", "self.v = [torch.zeros(p.shape) for p in self.params]")],
     None),
    ("adam", "config", [("        self.t += 1\n", ""),
                        ("            p -= self.lr * m_hat / (v_hat.sqrt() + self.eps)\n",
                         "            p -= self.lr * m_hat / (v_hat.sqrt() + self.eps)\n        self.t += 1\n")],
     "adam-t-from-zero"),
    ("adam", "plain", [("        self.m = [torch.zeros_like(p) for p in self.params]\n"
                        "        self.v = [torch.zeros_like(p) for p in self.params]\n",
                        "        self.m = self.v = [torch.zeros_like(p) for p in self.params]\n")], "adam-shared-state"),
    ("adam", "plain", [("p -= self.lr * m_hat / (v_hat.sqrt() + self.eps)", "p -= self.lr * m_hat / v_hat.sqrt() + self.eps")],
     None),
    # -- linear_split
    ("linear_split", "autograd", [("dweight, dbias = dout.T @ self.x, dout.sum(0)",
                                   "w_ = self.weight.clone().requires_grad_()\n"
                                   f"        (dweight,) = {AG}(self.x @ w_.T, w_, dout)\n        dbias = dout.sum(0)")],
     None),
    ("linear_split", "config", [("dweight, dbias = dout.T @ self.x, dout.sum(0)",
                                 "dweight, dbias = dout.T @ self.x, dout.squeeze().sum(0)")], None),
    ("linear_split", "near", [("dx = dout @ self.weight  # (N, D): all",
                               "dx = (dout.float() @ self.weight.float()).double()  #")], None),
    ("linear_split", "plain", [("dweight, dbias = dout.T @ self.x, dout.sum(0)",
                                "dweight, dbias = dout.T @ self.x.abs(), dout.sum(0)")], None),
    ("linear_split", "plain", [("dx = dout @ self.weight  # (N, D): all", "dx = self.backward(dout)  #")],
     "split-grad-in-b"),  # B running the fused backward: W's gradients added in B
    # -- tensor_parallel
    ("tensor_parallel", "autograd",
     [("return self.f.backward([dy @ w for dy, w in zip(dys, self.weights)])",
       "parts = []\n        for dy, w, x in zip(dys, self.weights, self.xs):\n"
       "            x_ = x.clone().requires_grad_()\n"
       f"            parts += list({AG}(x_ @ w.T, x_, dy))\n        return self.f.backward(parts)")], None),
    ("tensor_parallel", "config", [("self.biases = shard(bias, 0, ranks)", "self.biases = shard(bias, 0, 3)")], None),
    ("tensor_parallel", "near", [("gw += dy.T @ x  # (H/T, D)", "gw += (dy.T.float() @ x.float()).double()  #")],
     None),
    ("tensor_parallel", "plain", [("gb += dy.sum(0)", "gb += dy.sum(0) / len(dy)")], None),
    ("tensor_parallel", "plain", [("return self.f.backward([dy @ w for dy, w in zip(dys, self.weights)])",
                                   "return [dy @ w for dy, w in zip(dys, self.weights)]")], "tp-f-backward-identity"),
    # -- value
    ("value", "autograd", [("import math", "import math\nimport torch"),
                           ("self.grad += (1 - t ** 2) * out.grad", "x_ = torch.tensor(self.data, requires_grad=True)\n"
                            f"            (g_,) = {AG}(torch.tanh(x_), x_)\n            self.grad += g_.item() * out.grad")],
     None),
    ("value", "plain", [("self.grad += e * out.grad", "self.grad += self.data * out.grad")], None),
    ("value", "near", [("self.grad += (1 - t ** 2) * out.grad", "self.grad += (1 - t ** 2) * out.grad * (1 + 1e-8)")],
     None),
    ("value", "plain", [("            self.grad += out.grad\n            other.grad += out.grad\n",
                         "            self.grad += out.grad\n")], None),
    ("value", "config", [("        order, seen = [], set()\n        stack = [(self, False)]\n", "        order, seen = [], set()\n\n"
                           "        def build(v):\n            if id(v) not in seen:\n                seen.add(id(v))\n"
                           "                for p in v._prev:\n                    build(p)\n                order.append(v)\n"
                           "        build(self)\n        stack = []\n")], "value-recursion"),
]

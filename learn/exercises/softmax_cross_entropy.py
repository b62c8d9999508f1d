"""Exercise softmax_cross_entropy: write SoftmaxCrossEntropy, softmax and the cross-entropy loss in one
(nn.CrossEntropyLoss's, reduction mean).

Shapes (N = batch size, C = classes):
    logits (N, C), target (N,) int64 class indices in [0, C) -> loss, a 0-d tensor
    p = softmax(logits) row by row;  loss = mean over n of -log p[n, target[n]]
backward() takes no argument -- the loss is where the backward pass starts, dL/dloss = 1 -- and returns
dL/dlogits (N, C).  Through the softmax each logit moves every probability of its row; put together with
the log, the gradient comes out short.
{check}
"""
import torch


class SoftmaxCrossEntropy:
    def forward(self, logits, target):
        """logits (N, C), target (N,) int64 -> loss, a 0-d tensor (the mean over the batch)."""
        # TODO: p = softmax of each row (subtract the row's max before exp, so that exp cannot overflow), then
        #       the mean over the batch of -log p[n, target[n]]; keep what backward needs.
        ### BEGIN SOLUTION
        shifted = logits - logits.max(1, keepdim=True).values  # (N, C): exp cannot overflow
        logp = shifted - shifted.exp().sum(1, keepdim=True).log()  # (N, C) log-softmax
        self.p, self.target = logp.exp(), target  # (N, C), (N,)
        loss = -logp[torch.arange(len(target)), target].mean()
        ### END SOLUTION
        return loss

    def backward(self):
        """-> dlogits = dL/dlogits (N, C)."""
        # TODO: dL/dlogits (N, C) of the mean loss, from the saved probabilities p and target.
        # (Optional: record intermediates as self.saved = {"name": tensor}, names among shifted, p, dshifted, dp;
        #  the check compares each with autograd's, exact or not.)
        ### BEGIN SOLUTION
        n = len(self.target)
        dlogits = self.p.clone()  # (N, C)
        dlogits[torch.arange(n), self.target] -= 1  # p - onehot(target)
        dlogits /= n  # the loss is a mean over the batch
        ### END SOLUTION
        return dlogits

"""Exercise maxpool2d: write MaxPool2d, the max of each k x k window (nn.MaxPool2d's, no padding).

Shapes (N = batch size, C = channels, k = kernel_size, s = stride, k by default):
    x (N, C, H, W) -> out (N, C, H_out, W_out), H_out = (H - k) // s + 1, W_out = (W - k) // s + 1
    out[n, c, i, j] = max of x[n, c, i*s : i*s + k, j*s : j*s + k]
Only the input that won a window's max moved its output: the gradient goes back to it alone.  When
s < k the windows overlap, and an input can win two of them.
{check}
"""
import torch


class MaxPool2d:
    def __init__(self, kernel_size, stride=None):
        self.kernel_size = kernel_size
        self.stride = kernel_size if stride is None else stride

    def parameters(self):
        return []

    def forward(self, x):
        """x (N, C, H, W) -> out (N, C, H_out, W_out)."""
        # TODO: the max of each window, and for backward where in its window each max was (or a mask).
        ### BEGIN SOLUTION
        k, s = self.kernel_size, self.stride
        n, c, h, w = x.shape
        windows = x.unfold(2, k, s).unfold(3, k, s)  # (N, C, H_out, W_out, k, k), views into x
        out, self.arg = windows.reshape(*windows.shape[:4], k * k).max(-1)  # (N, C, H_out, W_out) each
        self.x_shape = x.shape
        ### END SOLUTION
        return out

    def backward(self, dout):
        """dout (N, C, H_out, W_out) -> dx (N, C, H, W)."""
        # TODO: dx (N, C, H, W), zero but where a window's max was: there it receives that window's dout;
        #       an input that won two overlapping windows receives both (add, don't assign).
        ### BEGIN SOLUTION
        k, s = self.kernel_size, self.stride
        n, c = dout.shape[:2]
        dx = torch.zeros(self.x_shape, dtype=dout.dtype)  # (N, C, H, W)
        for i in range(dout.shape[2]):
            for j in range(dout.shape[3]):
                winner = torch.nn.functional.one_hot(self.arg[:, :, i, j], k * k).to(dout.dtype)  # (N, C, k*k)
                dx[:, :, i * s:i * s + k, j * s:j * s + k] += (winner * dout[:, :, i, j, None]).view(n, c, k, k)
        ### END SOLUTION
        return dx

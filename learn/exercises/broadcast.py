"""Exercise broadcast: write ScaleShift, out = x * scale + shift with PyTorch's broadcasting, and its backward.

Shapes: x, scale and shift broadcast together (each is lined up from the right; a missing axis or an axis of
size 1 is stretched) to out's shape, e.g. x (N, C, L), scale (C, 1), shift (L,) -> out (N, C, L).

Broadcasting copies a tensor along an axis, and the backward of a copy is a sum: each input's gradient is
out's gradient summed back to the input's own shape, over every axis broadcasting stretched (the leading axes
it added, and each axis where the input has size 1, keeping that axis).  A bias added to every row, whose
gradient sums over the batch, is the simplest case.
{check}
"""
import torch


class ScaleShift:
    def parameters(self):
        return []

    def forward(self, x, scale, shift):
        """x, scale, shift (shapes that broadcast together) -> out = x * scale + shift, of the broadcast shape."""
        # TODO: out, and what backward needs (the tensors it multiplies by, and each input's shape).
        ### BEGIN SOLUTION
        self.x, self.scale = x, scale
        self.shapes = (x.shape, scale.shape, shift.shape)
        out = x * scale + shift
        ### END SOLUTION
        return out

    @staticmethod
    def sum_to(g, shape):
        """g (a broadcast shape) -> g summed back to ``shape`` (a shape that broadcasts to g's)."""
        # TODO: sum over the leading axes that shape lacks, then over each axis where shape has size 1 and g does
        #       not (keepdim=True, so that the 1 stays).
        ### BEGIN SOLUTION
        while g.dim() > len(shape):
            g = g.sum(0)  # an axis broadcasting added in front
        for axis, n in enumerate(shape):
            if n == 1 and g.shape[axis] != 1:
                g = g.sum(axis, keepdim=True)  # an axis of size 1, stretched
        ### END SOLUTION
        return g

    def backward(self, dout):
        """dout (out's shape) -> (dx, dscale, dshift), each of its input's shape."""
        # TODO: the gradient of each input in out's shape (out = x * scale + shift, element by element), then
        #       summed back to that input's shape with sum_to.
        ### BEGIN SOLUTION
        x_shape, scale_shape, shift_shape = self.shapes
        dx = self.sum_to(dout * self.scale, x_shape)
        dscale = self.sum_to(dout * self.x, scale_shape)
        dshift = self.sum_to(dout, shift_shape)
        ### END SOLUTION
        return dx, dscale, dshift

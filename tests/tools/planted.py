"""Planted-bug helpers shared by the layer capture tests (test_kcp_layer_capture.py,
test_kcp_megatron_capture.py)."""
import torch


class GradScale(torch.autograd.Function):
    """Identity forward, gradient times 1.02: a planted backward bug."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        return 1.02 * g

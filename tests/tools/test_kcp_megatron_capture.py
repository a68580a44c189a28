"""tools/kcp_megatron_layer.py on the CPU (ctest label tools): Debian's /usr/bin/python3 with
python3-torch, python3-h5py, python3-numpy; KCP_BIN and PYTHONPATH=tools:tests/tools set by ctest.

The Megatron stand-in (tests/tools/megatron_standin.py: SBHD input, fused in_proj, nn.Conv1d weights,
A_log / dt_bias on the layer, (out, bias) returns) is captured with forward hooks and its backward;
`kcp check` must pass every stage and gradient against the float64 layer oracle (KDA and GDN, float64
and float32, packed sequences), and a planted bug in one stage must be reported at that stage. The
seed is KCP_SEED (default 0), printed.
"""
import os
import subprocess
import tempfile
import unittest

import torch

from planted import GradScale

import kcp_megatron_layer as meg
import megatron_standin as ms

KCP = os.environ.get("KCP_BIN", "kcp")
SEED = int(os.environ.get("KCP_SEED", "0"))


class ScaledConv(ms.CausalConv1d):
    """A planted bug: the conv output 2% too large."""

    def forward(self, x, cu_seqlens=None):
        return 1.02 * super().forward(x, cu_seqlens)


class WrongBackwardConv(ms.CausalConv1d):
    """A planted bug in the conv's backward only: its output gradient arrives 2% too large."""

    def forward(self, x, cu_seqlens=None):
        return GradScale.apply(super().forward(x, cu_seqlens))


class WeakGate(ms.InKernelGate):
    """A planted bug in the in-kernel gate: the decay 10% too weak."""

    def forward(self, g, A_log, dt_bias):
        return 0.9 * super().forward(g, A_log, dt_bias)


class LoudBeta(ms.MegatronDeltaLayer):
    """A planted bug in beta = sigmoid(b): b read 1% too large."""

    def beta_act(self, b):
        return torch.sigmoid(1.01 * b)


class Extra(ms.MegatronDeltaLayer):
    """A module with a sub-module the capture does not know."""

    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        self.f_proj = torch.nn.Linear(4, 4)


class TestMegatronCapture(unittest.TestCase):
    def setUp(self):
        torch.manual_seed(SEED)
        self.tmp = tempfile.TemporaryDirectory()
        self.path = os.path.join(self.tmp.name, "megatron_layer.h5")

    def tearDown(self):
        self.tmp.cleanup()

    def check(self, layer, S, B, cu=None, backward=True):
        dtype = layer.out_proj.weight.dtype
        hidden = layer.config.hidden_size
        x = torch.randn(S, B, hidden, dtype=dtype)
        dout = torch.randn(S, B, hidden, dtype=dtype) if backward else None
        meg.capture_megatron_layer(layer, x, self.path, cu_seqlens=cu, dout=dout)
        r = subprocess.run([KCP, "check", self.path], capture_output=True, text=True)
        return r.returncode, r.stdout + r.stderr

    def assert_passes(self, rc, out, tensors=()):
        self.assertEqual(rc, 0, out)
        self.assertIn("no stage departs", out)
        for t in tensors:
            self.assertIn(t, out)
        print(out.splitlines()[0])

    def test_kda_float64_and_float32(self):
        for dtype in (torch.float64, torch.float32):
            layer = ms.MegatronDeltaLayer("kda", 16, 2, 4, 8, 8, dtype=dtype)
            self.assert_passes(*self.check(layer, 13, 2),
                               tensors=("qkv_conv", "grads/conv1d.weight", "grads/in_proj.weight", " a "))

    def test_gdn_float64_and_float32_packed(self):
        for dtype in (torch.float64, torch.float32):
            layer = ms.MegatronDeltaLayer("gdn", 12, 1, 2, 4, 4, conv_bias=True, dtype=dtype)
            self.assert_passes(*self.check(layer, 11, 1, cu=[0, 4, 5, 11]),
                               tensors=("dbeta_logit", "grads/beta_proj.weight", "grads/conv1d.bias"))

    def test_kda_packed(self):
        layer = ms.MegatronDeltaLayer("kda", 16, 2, 2, 8, 8)
        self.assert_passes(*self.check(layer, 17, 1, cu=[0, 6, 7, 17]))

    def test_without_kernel_submodule(self):
        # Megatron calls the kernel as a function: no hook sees q, k, beta, a; the rest is judged
        layer = ms.MegatronDeltaLayer("gdn", 12, 1, 2, 4, 4)
        kernel = layer.kernel
        del layer.kernel
        layer.forward = lambda x, cu=None, _k=kernel, _f=ms.MegatronDeltaLayer.forward: _run_with(layer, _k, _f, x, cu)
        self.assert_passes(*self.check(layer, 9, 1), tensors=("qkv_conv", " o "))

    def test_planted_conv_bug_is_reported_at_the_conv(self):
        layer = ms.MegatronDeltaLayer("kda", 16, 2, 2, 8, 8)
        layer.conv1d.__class__ = ScaledConv
        rc, out = self.check(layer, 11, 1)
        self.assertEqual(rc, 1, out)
        self.assertIn("first departure: stage 'conv' (tensor qkv_conv)", out)

    def test_planted_conv_backward_bug_is_reported_at_the_conv_backward(self):
        layer = ms.MegatronDeltaLayer("gdn", 12, 1, 2, 4, 4)
        layer.conv1d.__class__ = WrongBackwardConv
        rc, out = self.check(layer, 11, 1)
        self.assertEqual(rc, 1, out)
        self.assertIn("first departure: stage 'conv bwd' (tensor dqkv_proj)", out)

    def test_planted_gate_bug_is_reported_at_the_gate(self):
        layer = ms.MegatronDeltaLayer("kda", 16, 2, 2, 8, 8)
        layer.kernel.gate.__class__ = WeakGate
        rc, out = self.check(layer, 11, 1, backward=False)
        self.assertEqual(rc, 1, out)
        self.assertIn("first departure: stage 'gate:decay' (tensor a)", out)

    def test_planted_beta_bug_is_reported_at_beta(self):
        layer = LoudBeta("gdn", 12, 1, 2, 4, 4)
        rc, out = self.check(layer, 11, 1)
        self.assertEqual(rc, 1, out)
        self.assertIn("first departure: stage 'gate:beta' (tensor beta)", out)

    def test_unknown_submodule_and_missing_parameter_are_named(self):
        with self.assertRaisesRegex(meg.CaptureError, "unknown sub-module 'f_proj'"):
            self.check(Extra("kda", 16, 2, 2, 8, 8), 5, 1)
        layer = ms.MegatronDeltaLayer("kda", 16, 2, 2, 8, 8)
        del layer.A_log
        with self.assertRaisesRegex(meg.CaptureError, "missing parameter 'A_log'"):
            self.check(layer, 5, 1)
        layer = ms.MegatronDeltaLayer("gdn", 12, 1, 2, 4, 4)
        layer.in_proj.layer_norm_weight = torch.nn.Parameter(torch.ones(12, dtype=torch.float64))
        with self.assertRaisesRegex(meg.CaptureError, "'in_proj.layer_norm_weight': in_proj's fused pre-norm"):
            self.check(layer, 5, 1)


def _run_with(layer, kernel, forward, x, cu):
    """Runs the stand-in's forward with its kernel as a plain function (no sub-module to hook)."""
    object.__setattr__(layer, "kernel", kernel)  # an attribute, not a registered child
    try:
        return forward(layer, x, cu)
    finally:
        object.__delattr__(layer, "kernel")


if __name__ == "__main__":
    print(f"seed {SEED} (KCP_SEED)")
    unittest.main(verbosity=2)

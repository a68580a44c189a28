"""tools/kcp_layer_capture.py on the CPU (ctest label tools): Debian's /usr/bin/python3 with
python3-torch, python3-h5py, python3-numpy; KCP_BIN and PYTHONPATH=tools set by ctest.

A MaxText-design KDALayer (and GDN, fused in_proj, LoRA, packed sequences, padding) is captured with
forward hooks and its backward; `kcp check` must pass every stage and every stage gradient against
the float64 layer oracle (float64 and float32 modules), and a module with a planted bug in one
stage's forward or backward must be reported at that stage.
"""
import os
import subprocess
import tempfile
import unittest

import torch

from planted import GradScale

import kcp_layer_capture as cap

KCP = os.environ.get("KCP_BIN", "kcp")
SEED = int(os.environ.get("KCP_SEED", "0"))


def kcp_check(path):
    r = subprocess.run([KCP, "check", path], capture_output=True, text=True)
    return r.returncode, r.stdout + r.stderr


class ScaledConv(cap.CausalConv):
    """A planted bug: the conv output is 2% too large."""

    def forward(self, x, cu_seqlens=None):
        return 1.02 * super().forward(x, cu_seqlens)


class WrongBackwardConv(cap.CausalConv):
    """A planted bug in the conv's backward only: its output gradient arrives 2% too large."""

    def forward(self, x, cu_seqlens=None):
        return GradScale.apply(super().forward(x, cu_seqlens))


class WeakGate(cap.DecayGate):
    """A planted bug in the in-kernel gate: the decay 10% too weak."""

    def forward(self, g):
        return 0.9 * super().forward(g)


class LoudKernel(cap.DeltaKernel):
    """A planted bug in the recurrence's output: o 1% too large."""

    def forward(self, *args):
        o, ht = super().forward(*args)
        return 1.01 * o, ht


class TestLayerCapture(unittest.TestCase):
    def setUp(self):
        torch.manual_seed(SEED)
        self.tmp = tempfile.TemporaryDirectory()

    def tearDown(self):
        self.tmp.cleanup()

    def capture(self, layer, B, T, cu=None, backward=True):
        dtype = layer.out_proj.weight.dtype
        x = torch.randn(B, T, layer.config["hidden"], dtype=dtype)
        dout = torch.randn(B, T, layer.config["hidden"], dtype=dtype) if backward else None
        path = os.path.join(self.tmp.name, "layer.h5")
        cap.capture_layer(layer, x, path, cu_seqlens=cu, dout=dout)
        return kcp_check(path)

    def assert_passes(self, rc, out):
        self.assertEqual(rc, 0, out)
        self.assertIn("no stage departs", out)
        print(out.splitlines()[0])

    def test_kda_split_float64_and_float32(self):
        for dtype in (torch.float64, torch.float32):
            layer = cap.KDALayer(16, 2, 4, 8, 8, g_bias=True, dtype=dtype)
            rc, out = self.capture(layer, 2, 13)
            self.assert_passes(rc, out)
            self.assertIn("grads/conv1d.weight", out)

    def test_bfloat16_module_forward(self):
        # every tensor, the recurrent state included, in bf16: the forward stays within the bf16 bar
        # (0.02); its backward does not everywhere (dbeta 0.024 seen), see docs/LAYER.md
        layer = cap.KDALayer(32, 2, 2, 16, 16, fused_in_proj=True, dtype=torch.bfloat16)
        self.assert_passes(*self.capture(layer, 1, 40, backward=False))

    def test_megatron_like_fused_lora_packed(self):
        layer = cap.KDALayer(16, 2, 2, 8, 8, fused_in_proj=True, g_lora_rank=4, gate_lora_rank=3, conv_bias=True)
        self.assert_passes(*self.capture(layer, 1, 17, cu=[0, 6, 7, 17]))

    def test_gdn_softplus_silu(self):
        layer = cap.KDALayer(12, 1, 2, 4, 4, variant="gdn", fused_in_proj=True)
        self.assert_passes(*self.capture(layer, 1, 9, cu=[0, 4, 9]))

    def test_maxtext_padding(self):
        layer = cap.KDALayer(8, 2, 2, 4, 4, pad_multiple=64)
        self.assert_passes(*self.capture(layer, 2, 10))

    def test_planted_conv_bug_is_reported_at_the_conv(self):
        layer = cap.KDALayer(16, 2, 2, 8, 8)
        layer.conv1d.__class__ = ScaledConv
        rc, out = self.capture(layer, 1, 11)
        self.assertEqual(rc, 1, out)
        self.assertIn("first departure: stage 'conv' (tensor qkv_conv)", out)

    def test_planted_conv_backward_bug_is_reported_at_the_conv_backward(self):
        layer = cap.KDALayer(16, 2, 2, 8, 8)
        layer.conv1d.__class__ = WrongBackwardConv
        rc, out = self.capture(layer, 1, 11)
        self.assertEqual(rc, 1, out)
        self.assertIn("first departure: stage 'conv bwd' (tensor dqkv_proj)", out)

    def test_planted_gate_bug_is_reported_at_the_gate(self):
        layer = cap.KDALayer(16, 2, 2, 8, 8)
        layer.kernel.gate.__class__ = WeakGate
        rc, out = self.capture(layer, 1, 11, backward=False)
        self.assertEqual(rc, 1, out)
        self.assertIn("first departure: stage 'gate:decay' (tensor a)", out)

    def test_planted_recurrence_bug_is_reported_at_the_kernel(self):
        layer = cap.KDALayer(16, 2, 2, 8, 8, variant="gdn")
        layer.kernel.__class__ = LoudKernel
        rc, out = self.capture(layer, 1, 11)
        self.assertEqual(rc, 1, out)
        self.assertIn("first departure: stage 'kernel' (tensor o)", out)


if __name__ == "__main__":
    unittest.main(verbosity=2)

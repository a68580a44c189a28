"""tools/kcp_dump.py, numpy half, checked through the kcp executable (ctest label tools).

Run by Debian's /usr/bin/python3 (python3-h5py, python3-numpy) with KCP_BIN and PYTHONPATH=tools set
by ctest. Covers: RNE narrowing to bf16, a hand-computed GDN forward that kcp check must pass
exactly (and a wrong one it must fail), a hand-computed conv1d, the three bf16 encodings reading
the same, kcp run results rounded to bf16 passing the kernel bars, flags as uint8 or bool, and a
refused write leaving no file.
"""
import os
import subprocess
import sys
import tempfile
import unittest

import h5py
import numpy as np

import kcp_dump

KCP = os.environ.get("KCP_BIN", "kcp")
SEED = int(os.environ.get("KCP_SEED", "0"))


def kcp(*args):
    r = subprocess.run([KCP, *args], capture_output=True, text=True)
    return r.returncode, r.stdout, r.stderr


def gdn_forward(q, k, v, g, beta, h0, scale):
    """GDN token recurrence in float64, written from ALGORITHMS.md section 2.3 (one head, one sequence):
    e_t = v_t - (alpha_t S)^T k_t;  S <- alpha_t S + beta_t k_t e_t^T;  o_t = scale S^T q_t."""
    S = h0.copy()
    o = np.zeros_like(v)
    for t in range(q.shape[0]):
        a = np.exp(g[t])
        e = v[t] - (a * S).T @ k[t]
        S = a * S + beta[t] * np.outer(k[t], e)
        o[t] = scale * S.T @ q[t]
    return o, S


class KcpDumpTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory(prefix="kcp_dump_test_", dir=os.getcwd())
        self.rng = np.random.default_rng(SEED)

    def tearDown(self):
        self.dir.cleanup()

    def path(self, name):
        return os.path.join(self.dir.name, name)

    def test_round_to_nearest_even(self):
        tie = np.array([0x3F808000, 0x3F818000, 0xBF808000], dtype=np.uint32).view(np.float32)
        self.assertEqual(list(kcp_dump.bf16_bits_from_float32(tie)), [0x3F80, 0x3F82, 0xBF80])
        x = self.rng.standard_normal(4096).astype(np.float32)
        bits = kcp_dump.bf16_bits_from_float32(x)
        lo = (x.view(np.uint32) >> 16).astype(np.uint16)  # truncation and the next pattern up (same sign)
        cand = np.stack([kcp_dump.float32_from_bf16_bits(lo), kcp_dump.float32_from_bf16_bits(lo + 1)])
        err = np.abs(cand.astype(np.float64) - x.astype(np.float64))
        best = np.where(err[0] < err[1], lo, lo + 1)
        even = np.where(lo % 2 == 0, lo, lo + 1)
        expect = np.where(err[0] == err[1], even, best)
        np.testing.assert_array_equal(bits, expect)

    def gdn_case(self, T=3, K=4, V=3):
        q, k = self.rng.standard_normal((T, K)), self.rng.standard_normal((T, K))
        q /= np.linalg.norm(q, axis=1, keepdims=True)
        k /= np.linalg.norm(k, axis=1, keepdims=True)
        v = self.rng.standard_normal((T, V))
        g = self.rng.uniform(-0.3, -0.01, T)
        beta = self.rng.uniform(0, 1, T)
        h0 = self.rng.standard_normal((K, V))
        return q, k, v, g, beta, h0

    def test_hand_computed_gdn_passes_exactly_and_a_wrong_one_fails(self):
        q, k, v, g, beta, h0 = self.gdn_case()
        scale = q.shape[1] ** -0.5
        o, S = gdn_forward(q, k, v, g, beta, h0, scale)
        inputs = dict(q=q[None, :, None], k=k[None, :, None], v=v[None, :, None], g=g[None, :, None],
                      beta=beta[None, :, None], initial_state=h0[None, None])
        attrs = dict(scale=scale, use_qk_l2norm_in_kernel=False, use_gate_in_kernel=False, lower_bound=None)
        good = {"numpy_ref": dict(o=o[None, :, None], final_state=S[None, None])}
        kcp_dump.write_dump(self.path("gdn.h5"), "gdn", inputs, good, attrs)
        rc, out, err = kcp("check", self.path("gdn.h5"))
        self.assertEqual(rc, 0, out + err)
        self.assertEqual(out.count(" PASS"), 2)
        wrong = {"numpy_ref": dict(o=2 * o[None, :, None], final_state=S[None, None])}
        kcp_dump.write_dump(self.path("gdn_wrong.h5"), "gdn", inputs, wrong, attrs)
        rc, out, err = kcp("check", self.path("gdn_wrong.h5"))
        self.assertEqual(rc, 1, out + err)
        self.assertIn("FAIL", out)

    def test_hand_computed_conv1d(self):
        x = self.rng.standard_normal((1, 5, 2))
        w = self.rng.standard_normal((2, 2))
        b = self.rng.standard_normal(2)
        z = b + w[:, 1] * x[0] + w[:, 0] * np.vstack([np.zeros((1, 2)), x[0, :-1]])
        z[3] = b + w[:, 1] * x[0, 3]  # a second sequence starts at token 3: no history
        y = (z / (1 + np.exp(-z)))[None]
        inputs = dict(x=x, weight=w, bias=b, cu_seqlens=np.array([0, 3, 5]))
        kcp_dump.write_dump(self.path("conv.h5"), "conv1d", inputs, {"numpy_ref": dict(y=y)},
                            dict(activation="swish", kernel_size=2))
        rc, out, err = kcp("check", self.path("conv.h5"))
        self.assertEqual(rc, 0, out + err)
        self.assertEqual(out.count(" PASS"), 1)

    def bf16_inputs(self, T=40, H=2, K=8, V=8):
        def bf16(*shape):
            return kcp_dump.float32_from_bf16_bits(kcp_dump.bf16_bits_from_float32(
                self.rng.standard_normal(shape).astype(np.float32)))
        q, k = bf16(1, T, H, K), bf16(1, T, H, K)
        def unit_bf16(x):
            x = x / np.linalg.norm(x, axis=-1, keepdims=True)
            return kcp_dump.float32_from_bf16_bits(kcp_dump.bf16_bits_from_float32(x))
        q, k = unit_bf16(q), unit_bf16(k)
        inputs = dict(q=q, k=k, v=bf16(1, T, H, V), g=self.rng.uniform(-0.3, -0.01, (1, T, H, K)).astype(np.float32),
                      beta=kcp_dump.float32_from_bf16_bits(kcp_dump.bf16_bits_from_float32(
                          self.rng.uniform(0, 1, (1, T, H)).astype(np.float32))),
                      do=bf16(1, T, H, V))
        dtypes = dict(q="bfloat16", k="bfloat16", v="bfloat16", g="float32", beta="bfloat16", do="bfloat16")
        return inputs, dtypes

    def test_bf16_encodings_read_the_same(self):
        inputs, dtypes = self.bf16_inputs()
        for enc in kcp_dump.ENCODINGS:
            kcp_dump.write_dump(self.path(f"{enc}.h5"), "kda", inputs, None, {}, dtypes, bf16_encoding=enc)
        for enc in ("bf16_float", "bf16_bits"):
            rc, out, err = kcp("compare", self.path(f"{enc}.h5"), self.path("float32.h5"))
            self.assertEqual(rc, 0, out + err)
            self.assertIn("inputs: 6 pass, 0 warn, 0 fail", out)
            rc, out, err = kcp("info", self.path(f"{enc}.h5"))
            self.assertEqual(rc, 0, err)
            self.assertIn(f"dtype bfloat16 {enc}", " ".join(out.split()))
        with h5py.File(self.path("bf16_float.h5"), "r") as f:  # h5py itself reads the 2-byte float type
            np.testing.assert_array_equal(f["inputs/q"][...].astype(np.float32), inputs["q"])

    def test_kcp_run_results_rounded_to_bf16_pass_the_kernel_bars(self):
        inputs, dtypes = self.bf16_inputs()
        kcp_dump.write_dump(self.path("in.h5"), "kda", inputs, None, {}, dtypes)
        rc, out, err = kcp("run", "--backend", "cpu-recurrent", "--in", self.path("in.h5"),
                           "--out", self.path("run.h5"))
        self.assertEqual(rc, 0, out + err)
        with h5py.File(self.path("run.h5"), "r") as f:
            res = {n: f["cpu-recurrent"][n][...] for n in f["cpu-recurrent"]}
        as_bf16 = {n: kcp_dump.bf16_bits_from_float32(a.astype(np.float32)) for n, a in res.items()}
        kcp_dump.write_dump(self.path("kernel.h5"), "kda", inputs, {"fla_chunk": as_bf16}, {}, dtypes)
        rc, out, err = kcp("check", self.path("kernel.h5"))
        self.assertEqual(rc, 0, out + err)
        self.assertEqual(out.count(" PASS"), len(res))
        as_bf16["dk"] = kcp_dump.bf16_bits_from_float32(1.05 * res["dk"].astype(np.float32))
        kcp_dump.write_dump(self.path("kernel_bad.h5"), "kda", inputs, {"fla_chunk": as_bf16}, {}, dtypes)
        rc, out, err = kcp("check", self.path("kernel_bad.h5"))
        self.assertEqual(rc, 1, out + err)
        self.assertEqual(out.count("FAIL"), 1)

    def test_flags_as_uint8_or_bool_mean_the_same(self):
        inputs, dtypes = self.bf16_inputs()
        lines = []
        for flag in (True, np.uint8(1)):
            kcp_dump.write_dump(self.path("f.h5"), "kda", inputs, None,
                                dict(use_qk_l2norm_in_kernel=flag, use_beta_sigmoid_in_kernel=flag), dtypes)
            rc, out, err = kcp("info", self.path("f.h5"))
            self.assertEqual(rc, 0, err)
            lines.append([l for l in out.splitlines() if "problem:" in l][0])
        self.assertEqual(lines[0], lines[1])
        self.assertIn("l2norm,beta_sigmoid", lines[0])

    def test_a_refused_write_leaves_no_file(self):
        inputs, dtypes = self.bf16_inputs()
        inputs["v"] = inputs["v"] + np.float32(1e-3)  # no longer bfloat16 values
        with self.assertRaises(ValueError):
            kcp_dump.write_dump(self.path("x.h5"), "kda", inputs, None, {}, dtypes)
        self.assertEqual(os.listdir(self.dir.name), [])


if __name__ == "__main__":
    print(f"kcp tools tests: seed {SEED} (set KCP_SEED to change)")
    sys.exit(0 if unittest.main(exit=False, verbosity=2).result.wasSuccessful() else 1)

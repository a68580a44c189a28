"""The torch half of kcp_dump (KernelCapture, install_megatron_capture) on the CPU, judged by kcp check.

Run by Debian's /usr/bin/python3 with python3-torch (ctest label tools; KCP_BIN and PYTHONPATH set by
ctest). Stand-in kernels with FLA 0.5.2's exact signatures and naive float32 torch math
(fla_standin.py) are captured through every keyword route (positional, keyword, **kwargs: A_log,
dt_bias, chunk_size, gdn's use_gate_in_kernel, the transpose_state_layout alias, cu_seqlens_cpu,
disable_recompute, cp_context, chunk_indices), in bf16 and float32, directly and through a stand-in
Megatron module; kcp check must pass each one, and FAIL a planted 1% error in o and in dq. Also:
unknown arguments recorded and reported, gradients that never arrive reported (flush and exit),
bad input refused at capture time naming the argument, plain attribute types, 0644 files, and
`pip install` of the package into a fresh target folder. Seeded (KCP_SEED, printed).
"""
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

import h5py
import numpy as np
import torch

import fla_standin as fla
import kcp_dump

KCP = os.environ.get("KCP_BIN", "kcp")
SEED = int(os.environ.get("KCP_SEED", "0"))
HERE = os.path.dirname(os.path.abspath(__file__))
PACKAGE = os.path.join(HERE, "..", "..", "tools", "kcp_dump")


def kcp(*args):
    r = subprocess.run([KCP, *args], capture_output=True, text=True)
    return r.returncode, r.stdout, r.stderr


class Case:
    """Random inputs of one call: q, k [B,T,H,K], v [B,T,HV,V], g, beta, gate parameters, states."""

    def __init__(self, op, dtype, B=1, T=24, H=2, HV=2, K=8, V=8, cu=None, h0=False, raw_gate=False, seed=0):
        gen = torch.Generator().manual_seed(seed)
        r = lambda *s: torch.randn(*s, generator=gen)
        self.q, self.k = r(B, T, H, K).to(dtype), r(B, T, H, K).to(dtype)
        self.v = r(B, T, HV, V).to(dtype)
        gshape = (B, T, HV) if op == "gdn" else (B, T, HV, K)
        self.g = r(*gshape) if raw_gate else -torch.rand(*gshape, generator=gen) * 0.3 - 0.01
        self.g = self.g.to(dtype if op != "gdn" else torch.float32)
        self.beta = torch.rand(B, T, HV, generator=gen).to(dtype)
        self.A_log = (torch.rand(HV, generator=gen) * 0.5 - 1).float()
        self.dt_bias = (r(HV if op == "gdn" else HV * K) * 0.2).float()
        N = len(cu) - 1 if cu is not None else B
        self.cu = torch.tensor(cu, dtype=torch.long) if cu is not None else None
        self.h0 = r(N, HV, K, V).float() * 0.1 if h0 else None
        self.do, self.dht = r(B, T, HV, V).to(dtype), r(N, HV, K, V).float()
        for t in (self.q, self.k, self.v, self.g, self.beta, self.A_log, self.dt_bias, self.h0):
            if t is not None:
                t.requires_grad_(True)

    def backward(self, o, ht):
        loss = (o.float() * self.do.float()).sum()
        if ht is not None:
            loss = loss + (ht * self.dht).sum()
        loss.backward()


class CaptureTest(unittest.TestCase):
    def setUp(self):
        fla.PLANT.clear()
        self.dir = tempfile.TemporaryDirectory(prefix="kcp_capture_test_", dir=os.getcwd())

    def tearDown(self):
        fla.PLANT.clear()
        self.dir.cleanup()

    def path(self, name):
        return os.path.join(self.dir.name, name)

    def check(self, path, expect_rc=0, n_judged=None):
        rc, out, err = kcp("check", path)
        self.assertEqual(rc, expect_rc, f"kcp check {path}:\n{out}{err}")
        if n_judged is not None:
            self.assertEqual(out.count(" PASS") + out.count(" WARN"), n_judged, out)
        return out

    def capture(self, kernel, name, *args, **kwargs):
        """One captured call plus backward; returns the file's path."""
        case = kwargs.pop("case")
        cap = kcp_dump.KernelCapture(kernel, self.path(name))
        o, ht = cap(*args, **kwargs)
        case.backward(o, ht)
        self.assertTrue(cap.written, f"{name}: not written after backward (missing {cap.missing()})")
        return self.path(name)

    # --- every keyword route, through kcp check ----------------------------------------------------
    def test_kda_megatron_call_lower_bound_bf16(self):
        """The issue's false alarm: A_log and dt_bias through **kwargs, lower-bound gate, safe_gate."""
        c = Case("kda", torch.bfloat16, T=40, cu=[0, 17, 40], h0=True, raw_gate=True, seed=SEED)
        p = self.capture(fla.chunk_kda, "kda_lb.h5", c.q, c.k, c.v, c.g, c.beta, case=c, A_log=c.A_log,
                         dt_bias=c.dt_bias, use_gate_in_kernel=True, safe_gate=True, lower_bound=-5.0,
                         use_qk_l2norm_in_kernel=True, initial_state=c.h0, output_final_state=True, cu_seqlens=c.cu)
        with h5py.File(p, "r") as f:
            self.assertIn("A_log", f["inputs"])
            self.assertIn("dt_bias", f["inputs"])
            self.assertEqual(f.attrs["lower_bound"], -5.0)
            self.assertEqual(set(f["fla_chunk"]), {"o", "final_state", "dq", "dk", "dv", "dg", "dbeta",
                                                   "dinitial_state", "dA_log", "ddt_bias"})
            self.assertIsInstance(f.attrs["torch_version"], str)
        self.assertEqual(os.stat(p).st_mode & 0o777, 0o644)
        self.check(p, 0, 10)

    def test_kda_softplus_gate_float32_kwargs_chunk_size(self):
        c = Case("kda", torch.float32, T=30, raw_gate=True, seed=SEED + 1)
        p = self.capture(fla.chunk_kda, "kda_sp.h5", c.q, c.k, c.v, c.g, c.beta, case=c, A_log=c.A_log,
                         dt_bias=c.dt_bias, use_gate_in_kernel=True, chunk_size=32, output_final_state=True)
        with h5py.File(p, "r") as f:
            self.assertEqual(f.attrs["chunk_size"], 32)
        self.check(p, 0, 9)

    def test_kda_lower_bound_without_A_log(self):
        c = Case("kda", torch.bfloat16, T=20, raw_gate=True, seed=SEED + 2)
        c.A_log = None
        p = self.capture(fla.chunk_kda, "kda_lb_noA.h5", c.q, c.k, c.v, c.g, c.beta, case=c, dt_bias=c.dt_bias,
                         use_gate_in_kernel=True, lower_bound=-3.0)
        self.check(p, 0, 7)

    def test_kda_positional_gva_neg_eigval_alias_float32(self):
        """Every named parameter positionally; GVA; beta sigmoid with negative eigenvalues; the old
        name of state_v_first; disable_recompute and cu_seqlens_cpu."""
        c = Case("kda", torch.float32, T=24, H=1, HV=2, cu=[0, 9, 24], h0=True, seed=SEED + 3)
        cap = kcp_dump.KernelCapture(fla.chunk_kda, self.path("kda_pos.h5"))
        h0 = c.h0.detach().transpose(-1, -2).contiguous().requires_grad_(True)  # [N,HV,V,K]
        c.h0, c.dht = h0, c.dht.transpose(-1, -2).contiguous()
        o, ht = cap(c.q, c.k, c.v, c.g, c.beta, None, h0, True, False, False, True, True, False, None, True,
                    False, False, c.cu, c.cu.clone(), None, transpose_state_layout=True)
        c.backward(o, ht)
        with h5py.File(self.path("kda_pos.h5"), "r") as f:
            self.assertEqual(f.attrs["state_layout"], "VK")
            self.assertTrue(f.attrs["disable_recompute"])
            self.assertTrue(f.attrs["cu_seqlens_cpu_given"])
            self.assertIn("transpose_state_layout", f.attrs["aliased_args"])
        self.check(self.path("kda_pos.h5"), 0, 8)

    def test_gdn_gate_in_kernel_kwargs_gva_bf16(self):
        c = Case("gdn", torch.bfloat16, T=40, H=1, HV=2, cu=[0, 25, 40], h0=True, raw_gate=True, seed=SEED + 4)
        p = self.capture(fla.chunk_gated_delta_rule, "gdn_gate.h5", c.q, c.k, c.v, c.g, c.beta, case=c,
                         use_gate_in_kernel=True, A_log=c.A_log, dt_bias=c.dt_bias, use_qk_l2norm_in_kernel=True,
                         use_beta_sigmoid_in_kernel=True, initial_state=c.h0, output_final_state=True,
                         cu_seqlens=c.cu, cu_seqlens_cpu=c.cu.clone(), chunk_size=16)
        with h5py.File(p, "r") as f:
            self.assertTrue(f.attrs["use_gate_in_kernel"])
            self.assertEqual(f.attrs["chunk_size"], 16)
        self.check(p, 0, 10)

    def test_gdn_state_v_first_float32_ignored_kwargs(self):
        """gdn's safe_gate / lower_bound: FLA 0.5.2's gdn does not read them; recorded as ignored, not used."""
        c = Case("gdn", torch.float32, B=2, T=16, h0=True, seed=SEED + 5)
        h0 = c.h0.detach().transpose(-1, -2).contiguous().requires_grad_(True)
        c.h0, c.dht = h0, c.dht.transpose(-1, -2).contiguous()
        p = self.capture(fla.chunk_gdn, "gdn_vk.h5", c.q, c.k, c.v, c.g, c.beta, case=c, initial_state=h0,
                         output_final_state=True, state_v_first=True, safe_gate=True, lower_bound=-2.0)
        with h5py.File(p, "r") as f:
            self.assertEqual(f.attrs["ignored_args"], "safe_gate, lower_bound")
            self.assertTrue(np.isnan(f.attrs["lower_bound"]))
        self.check(p, 0, 8)

    def test_gla_bf16_and_float32(self):
        for dtype in (torch.bfloat16, torch.float32):
            c = Case("gla", dtype, T=20, cu=[0, 8, 20], h0=True, seed=SEED + 6)
            name = f"gla_{str(dtype)[6:]}.h5"
            p = self.capture(fla.chunk_gla, name, c.q, c.k, c.v, c.g, case=c, initial_state=c.h0,
                             output_final_state=True, cu_seqlens=c.cu)
            self.check(p, 0, 7)

    def test_cp_context_single_rank(self):
        c = Case("kda", torch.bfloat16, T=24, seed=SEED + 7)
        cu = torch.tensor([0, 10, 24])
        ctx = fla.FLACPContext(cu_seqlens=cu, cu_seqlens_cpu=cu, is_first_rank=True, is_last_rank=True,
                               pre_num_ranks=0, post_num_ranks=0, pre_num_conv_tokens=0)
        p = self.capture(fla.chunk_kda, "kda_cp.h5", c.q, c.k, c.v, c.g, c.beta, case=c, cp_context=ctx)
        with h5py.File(p, "r") as f:
            self.assertEqual(list(f["inputs/cu_seqlens_local"][...]), [0, 10, 24])
            self.assertEqual(f.attrs["cp_mode"], "chunkwise")
        self.check(p, 0, 6)

    # --- planted errors -----------------------------------------------------------------------------
    def test_planted_one_percent_error_fails(self):
        for plant, tensor in (({"o": 0.01}, "o"), ({"dq": 0.01}, "dq")):
            for dtype in (torch.bfloat16, torch.float32):
                fla.PLANT.clear()
                fla.PLANT.update(plant)
                c = Case("kda", dtype, T=32, raw_gate=True, seed=SEED + 8)
                p = self.capture(fla.chunk_kda, f"planted_{tensor}_{str(dtype)[6:]}.h5", c.q, c.k, c.v, c.g,
                                 c.beta, case=c, A_log=c.A_log, dt_bias=c.dt_bias, use_gate_in_kernel=True)
                out = self.check(p, 1)
                row = [l for l in out.splitlines() if l.split()[1:2] == [tensor]][0]
                self.assertIn("FAIL", row, out)

    # --- Megatron ---------------------------------------------------------------------------------------
    def test_megatron_module_with_recompute(self):
        class KimiDeltaAttention(torch.nn.Module):  # stand-in: keyword call, as Megatron's layer makes it
            def __init__(self):
                super().__init__()
                self.layer_number = 3
                self.gated_delta_rule = fla.chunk_kda

            def forward(self, c):
                return self.gated_delta_rule(q=c.q, k=c.k, v=c.v, g=c.g, beta=c.beta, A_log=c.A_log,
                                             dt_bias=c.dt_bias, use_qk_l2norm_in_kernel=False,
                                             use_gate_in_kernel=True, safe_gate=True, lower_bound=-5.0,
                                             cu_seqlens=c.cu)

        layer = KimiDeltaAttention()
        cap = kcp_dump.install_megatron_capture(layer, self.path("run1"), iteration=7)
        c = Case("kda", torch.bfloat16, T=32, cu=[0, 12, 32], raw_gate=True, seed=SEED + 9)
        with torch.no_grad():
            layer(c)  # selective recompute: the first forward runs without grad and is not kept
        o, _ = layer(c)
        c.backward(o, None)
        path = self.path("run1/kda_L3_it7_mb0_tp0of1_cp0of1.h5")
        self.assertTrue(cap.written and os.path.exists(path), os.listdir(self.dir.name))
        with h5py.File(path, "r") as f:
            self.assertIn("megatron", f)
            self.assertEqual(f.attrs["source_framework"], "megatron-lm")
        self.check(path, 0, 8)

    def test_megatron_placement_failure_is_an_error(self):
        code = ("import sys, types, kcp_dump\n"
                "ps = types.SimpleNamespace(model_parallel_is_initialized=lambda: True,\n"
                "    get_tensor_model_parallel_world_size=lambda: 1/0)\n"
                "m = types.ModuleType('megatron'); c = types.ModuleType('megatron.core'); c.parallel_state = ps\n"
                "sys.modules.update({'megatron': m, 'megatron.core': c, 'megatron.core.parallel_state': ps})\n"
                "kcp_dump.megatron_placement()\n")
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("megatron_placement: Megatron's parallel_state failed", r.stderr)

    # --- what is reported -------------------------------------------------------------------------
    def test_unknown_argument_is_recorded_and_reported(self):
        c = Case("gdn", torch.float32, T=12, seed=SEED + 10)
        cap = kcp_dump.KernelCapture(fla.chunk_gated_delta_rule, self.path("unknown.h5"))
        extra = torch.ones(3)
        fla_kwargs = dict(my_new_flag=True, my_tensor=extra)
        o, ht = cap(c.q, c.k, c.v, c.g, c.beta, **fla_kwargs)
        c.backward(o, ht)
        with h5py.File(self.path("unknown.h5"), "r") as f:
            self.assertEqual(f.attrs["unknown_args"], "my_new_flag, my_tensor")
            self.assertTrue(f.attrs["arg_my_new_flag"])
            self.assertIn("arg_my_tensor", f["debug"])
        self.check(self.path("unknown.h5"), 0, 6)

    def test_missing_gradients_are_reported_on_flush_and_at_exit(self):
        c = Case("kda", torch.float32, T=8, seed=SEED + 11)
        cap = kcp_dump.KernelCapture(fla.chunk_kda, self.path("flushed.h5"))
        cap(c.q, c.k, c.v, c.g, c.beta)
        cap.flush()
        with h5py.File(self.path("flushed.h5"), "r") as f:
            self.assertIn("dq", f.attrs["missing_gradients"])
        code = ("import torch, fla_standin as fla, kcp_dump\n"
                "q = torch.randn(1, 8, 1, 4, requires_grad=True)\n"
                "cap = kcp_dump.KernelCapture(fla.chunk_kda, %r)\n"
                "cap(q, torch.randn(1, 8, 1, 4), torch.randn(1, 8, 1, 4), -torch.rand(1, 8, 1, 4), torch.rand(1, 8, 1))\n"
                % self.path("at_exit.h5"))
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=os.environ)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("the process exits before do, dq arrived", r.stderr)
        self.assertTrue(os.path.exists(self.path("at_exit.h5")))

    def test_bad_input_is_refused_at_capture_time(self):
        c = Case("kda", torch.float32, T=8, seed=SEED + 12)
        cap = kcp_dump.KernelCapture(fla.chunk_kda, self.path("bad.h5"))
        with self.assertRaisesRegex(ValueError, "argument k is on meta, q on cpu"):
            cap(c.q, torch.empty(c.k.shape, device="meta"), c.v, c.g, c.beta)
        with self.assertRaisesRegex(ValueError, "argument v: dtype int32 is not a float type"):
            cap(c.q, c.k, c.v.detach().int(), c.g, c.beta)
        with self.assertRaisesRegex(ValueError, "argument v is bfloat16, q is float32"):
            cap(c.q, c.k, c.v.detach().bfloat16(), c.g, c.beta)
        with self.assertRaisesRegex(ValueError, "unsupported kernel 'chunk_mamba'"):
            def chunk_mamba(x):
                return x
            kcp_dump.KernelCapture(chunk_mamba, self.path("x.h5"))
        with self.assertRaisesRegex(TypeError, "head_first"):
            cap(c.q, c.k, c.v, c.g, c.beta, head_first=False)
        with self.assertRaises(AssertionError):  # the kernel itself refuses: nothing kept for the exit
            cap(c.q, c.k, c.v, c.g, c.beta, chunk_size=48)
        self.assertEqual(cap.inputs, {})
        with self.assertRaisesRegex(ValueError, "declared bfloat16 but holds values that are not bfloat16"):
            kcp_dump.write_dump(self.path("x.h5"), "kda", dict(q=np.full((1, 2, 1, 4), 1.001, np.float32)),
                                dtypes=dict(q="bfloat16"))
        with self.assertRaisesRegex(TypeError, "attribute note: cannot store a dict"):
            kcp_dump.write_dump(self.path("x.h5"), "kda", {}, attrs=dict(note={"a": 1}))
        self.assertEqual(sorted(os.listdir(self.dir.name)), [])

    # --- kcp check / compare for CI and for a person ------------------------------------------------
    def planted_from_token(self, name, t0=20, scale=1.03):
        """A bf16 kda capture whose o is off by 3% on head 1 from token t0 on."""
        c = Case("kda", torch.bfloat16, T=40, cu=[0, 14, 40], seed=SEED + 13)
        p = self.capture(fla.chunk_kda, name, c.q, c.k, c.v, c.g, c.beta, case=c, cu_seqlens=c.cu)
        with h5py.File(p, "r+") as f:
            o = f["fla_chunk/o"][...].astype(np.float32)
            o[0, t0:, 1] *= scale
            attrs = dict(f["fla_chunk/o"].attrs)
            del f["fla_chunk/o"]
            f["fla_chunk"].create_dataset("o", data=kcp_dump.float32_from_bf16_bits(kcp_dump.bf16_bits_from_float32(o)))
            f["fla_chunk/o"].attrs.update(dict(attrs, encoding="ieee"))
        return p

    def test_check_json_select_bars_and_exit_3(self):
        import json
        p = self.planted_from_token("planted_t20.h5")
        js = self.path("check.json")
        rc, out, err = kcp("check", "--json", js, p)
        self.assertEqual(rc, 1, out + err)
        rec = json.load(open(js))
        rows = {r["tensor"]: r for r in rec["files"][0]["tensors"]}
        self.assertEqual(rows["o"]["verdict"], "FAIL")
        self.assertEqual(rows["dq"]["verdict"], "PASS")
        self.assertGreater(rows["o"]["over_the_bar"], 0)
        self.assertEqual(rec["exit_status"], 1)
        self.assertEqual(rec["total"]["fail"], 1)
        rc, out, _ = kcp("check", "--select", "dq,fla_chunk/dv", p)  # o not judged
        self.assertEqual(rc, 0, out)
        self.assertEqual(out.count(" PASS"), 2)
        rc, out, _ = kcp("check", "--select", "nothing_like_this", p)
        self.assertEqual(rc, 3, out)
        self.assertIn("nothing was judged", out)
        rc, out, _ = kcp("check", "--ratio", "0.05", p)  # a looser user bar: everything passes
        self.assertEqual(rc, 0, out)
        self.assertIn("user bar: --ratio 0.05", out)
        rc, out, _ = kcp("check", "--rtol", "0", "--atol", "0", "--select", "o", p)  # torch: every element
        self.assertEqual(rc, 1, out)
        self.assertIn("torch.testing.assert_close", out)
        rc, out, err = kcp("check", "--rtol", "0.1", p)
        self.assertEqual(rc, 2)
        self.assertIn("--rtol and --atol go together", err)
        kcp_dump.write_dump(self.path("inputs_only.h5"), "gla", dict(q=np.ones((1, 2, 1, 4)), k=np.ones((1, 2, 1, 4)),
                            v=np.ones((1, 2, 1, 4)), g=-np.ones((1, 2, 1, 4))))
        rc, out, _ = kcp("check", self.path("inputs_only.h5"))
        self.assertEqual(rc, 3, out)

    def test_check_plot_writes_pngs(self):
        p = self.planted_from_token("planted_plot.h5")
        rc, out, err = kcp("check", "--plot", self.path("plots"), p)
        self.assertEqual(rc, 1, out + err)
        png = self.path("plots/planted_plot__fla_chunk__o.png")
        with open(png, "rb") as f:
            head = f.read(24)
        self.assertEqual(head[:8], b"\x89PNG\r\n\x1a\n")
        self.assertEqual(int.from_bytes(head[16:20], "big"), 1100)  # width
        self.assertEqual(sorted(os.listdir(self.path("plots"))), ["planted_plot__fla_chunk__o.png"])  # failing only

    def test_compare_any_hdf5_and_one_sided(self):
        a, b = self.path("a.h5"), self.path("b.h5")
        with h5py.File(a, "w") as f:
            f["x/y"] = np.arange(6.0).reshape(2, 3)
            f["z"] = np.ones(4, np.float32)
            f["only_a"] = np.zeros(2)
        with h5py.File(b, "w") as f:
            f["x/y"] = np.arange(6.0).reshape(2, 3)
            f["z"] = np.ones(4, np.float32) + np.float32(1e-3)
            f["only_b"] = np.zeros(2)
        rc, out, _ = kcp("compare", a, b)
        self.assertEqual(rc, 1, out)
        self.assertRegex(out, r"/x/y .* PASS")
        self.assertRegex(out, r"/z .* FAIL")
        self.assertIn("only in " + a, out)
        self.assertIn("only in " + b, out)
        rc, out, _ = kcp("compare", "--delta", "0.01", "--select", "x/y,z", a, b)
        self.assertEqual(rc, 0, out)

    def test_help_for_every_command_and_version(self):
        rc, out, _ = kcp("--version")
        self.assertEqual(rc, 0)
        self.assertRegex(out, r"^kcp \d+\.\d+")
        rc, out, _ = kcp("help")
        commands = [l.split()[0] for l in out.splitlines() if l.startswith("  ")]
        self.assertIn("check", commands)
        for c in commands:
            rc, out, err = kcp(c, "--help")
            self.assertEqual(rc, 0, c + err)
            self.assertIn("usage:", out, c)
        rc, out, _ = kcp("check", "--help")
        for opt in ("--json", "--select", "--ratio", "--rtol", "--atol", "--plot", "default"):
            self.assertIn(opt, out)

    def test_pip_install_into_a_fresh_target(self):
        target = self.path("site")
        # setuptools builds in the source folder (build/, *.egg-info): install from a copy, so the
        # test never writes into the repository
        source = self.path("kcp_dump_src")
        shutil.copytree(PACKAGE, source, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
        r = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                            "--no-index", "--target", target, source], capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        code = "import kcp_dump, sys; print(kcp_dump.__file__); kcp_dump.KernelCapture"
        env = dict(os.environ, PYTHONPATH=target)
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=self.dir.name)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertTrue(r.stdout.startswith(target), r.stdout)


if __name__ == "__main__":
    print(f"kcp capture tests: seed {SEED} (set KCP_SEED to change), torch {torch.__version__}")
    sys.exit(0 if unittest.main(exit=False, verbosity=2).result.wasSuccessful() else 1)

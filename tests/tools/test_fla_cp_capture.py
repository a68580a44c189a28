"""scripts/fla_cp_capture.py without a GPU: 2 ranks spawned over gloo on the CPU, the FLA stand-in
(fla_standin.py: FLA 0.5.2's signatures, naive torch math, build_cp_context from ALGORITHMS.md 5.1)
in place of FLA. The sequences are cut only at rank edges, since the stand-in passes no state
between ranks; so each rank's call is exact and the assembled global file must pass `kcp check`.
Checks: the rank files carry the global cu_seqlens (scope "global"), token_offset and FLA's local
cu_seqlens; `kcp assemble` + `kcp check` of kda (bf16) and gdn (float32) pass every tensor (dA_log and
ddt_bias summed over the ranks); --h0 is FLA's refusal (exit 3); a capture whose global cu_seqlens
contradicts the context is refused. The stand-in goes through FLA's two exchange points (tapped by the
script into /debug/cp_transition_fwd, _bwd): at edge cuts every rank gathers zeros (rows skipped with
FLA's reason); with a sequence cut inside (10,20,18) rank 0's forward and rank 1's backward transition
are judged against the oracle's in the rank files and pass (the global file does not: the stand-in
merges nothing). Run by ctest (label tools) with /usr/bin/python3 (python3-torch);
KCP_BIN and PYTHONPATH set by ctest. Seeded (KCP_SEED, printed).
"""
import json
import os
import subprocess
import sys
import tempfile
import unittest

import h5py
import torch

import fla_standin
import kcp_dump

KCP = os.environ.get("KCP_BIN", "kcp")
SEED = int(os.environ.get("KCP_SEED", "14"))
HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "..", "..", "scripts", "fla_cp_capture.py")


def run_script(out, *extra):
    env = dict(os.environ, KCP_FLA_STANDIN="fla_standin", OMP_NUM_THREADS="1")
    cmd = [sys.executable, SCRIPT, "--nproc", "2", "--backend", "gloo", "--device", "cpu", "--H", "2", "--K", "8",
           "--V", "8", "--seqlens", "10,14,5,19", "--seed", str(SEED), "--out", out, "--kcp", KCP, *extra]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    return r.returncode, r.stdout + r.stderr


def transition_rows(out, op, rank):
    """{tensor: verdict} of the debug/cp_transition_* rows of rank `rank`'s file in check_ranks.json."""
    with open(os.path.join(out, "check_ranks.json")) as f:
        files = json.load(f)["files"]
    name = f"{op}_L0_it0_mb0_tp0of1_cp{rank}of2.h5"
    (record,) = [r for r in files if os.path.basename(r["path"]) == name]
    return {t["tensor"]: t["verdict"] for t in record["tensors"] if t["group"] == "debug"}


class FlaCpCaptureTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        print(f"test_fla_cp_capture: seed {SEED}", flush=True)

    def setUp(self):
        self.dir = tempfile.TemporaryDirectory(prefix="kcp_fla_cp_test_", dir=os.getcwd())

    def tearDown(self):
        self.dir.cleanup()

    def judged(self, out, op, dtype):
        rc, log = run_script(out, "--op", op, "--dtype", dtype)
        self.assertEqual(rc, 0, log)
        with h5py.File(os.path.join(out, f"{op}_L0_it0_mb0_tp0of1_cp1of2.h5"), "r") as f:
            self.assertEqual(list(f["inputs/cu_seqlens"][...]), [0, 10, 24, 29, 48])
            self.assertEqual(f["inputs/cu_seqlens"].attrs["scope"], "global")
            self.assertEqual(list(f["inputs/cu_seqlens_local"][...]), [0, 5, 24])
            self.assertEqual((f.attrs["token_offset"], f.attrs["cp_rank"], f.attrs["cp_size"]), (24, 1, 2))
        with open(os.path.join(out, "check_global.json")) as f:
            record = json.load(f)
        self.assertEqual(record["exit_status"], 0, log)
        for rank in (0, 1):  # both ranks first and last: FLA gathers zeros, kcp says why it skips them
            rows = transition_rows(out, op, rank)
            self.assertEqual(set(rows.values()), {"SKIP"}, log)
            self.assertEqual(len(rows), 4, log)
        return log

    def test_kda_bf16_two_ranks_assemble_and_pass(self):
        log = self.judged(self.dir.name, "kda", "bf16")
        for tensor in ("o", "dq", "dk", "dv", "dg", "dbeta", "dA_log", "ddt_bias"):
            self.assertRegex(log, rf"fla_chunk +{tensor} .*PASS", f"{tensor} not judged:\n{log}")

    def test_gdn_fp32_two_ranks_assemble_and_pass(self):
        log = self.judged(self.dir.name, "gdn", "fp32")
        self.assertIn("kcp assemble: 2 shards", log)

    def test_transitions_of_a_cut_sequence_are_judged_in_the_rank_files(self):
        out = self.dir.name  # the cut at 24 falls inside [10, 30): rank 0 gathers (S_ext | M) of [10, 24),
        rc, log = run_script(out, "--op", "kda", "--dtype", "bf16", "--seqlens", "10,20,18")  # rank 1 of [24, 30)
        self.assertIn(rc, (0, 1), log)  # the global file fails (the stand-in merges nothing)
        self.assertEqual(transition_rows(out, "kda", 0), {"cp_transition_fwd.S": "PASS", "cp_transition_fwd.M": "PASS",
                                                          "cp_transition_bwd.dS": "SKIP", "cp_transition_bwd.MT": "SKIP"}, log)
        self.assertEqual(transition_rows(out, "kda", 1), {"cp_transition_fwd.S": "SKIP", "cp_transition_fwd.M": "SKIP",
                                                          "cp_transition_bwd.dS": "PASS", "cp_transition_bwd.MT": "PASS"}, log)
        with h5py.File(os.path.join(out, "kda_L0_it0_mb0_tp0of1_cp0of2.h5"), "r") as f:
            self.assertEqual(f["debug/cp_transition_fwd"].shape, (2, 8, 16))
            self.assertFalse(f.attrs["cp_is_last_rank"])

    def test_h0_is_refused_as_fla_does(self):
        rc, log = run_script(self.dir.name, "--op", "kda", "--h0")
        self.assertEqual(rc, 3, log)
        with open(os.path.join(self.dir.name, "rank0.json")) as f:
            self.assertTrue(json.load(f)["status"].startswith("refused by FLA"))

    def test_global_cu_seqlens_must_match_the_context(self):
        ctx = fla_standin.FLACPContext(cu_seqlens=torch.tensor([0, 4, 8]), is_first_rank=True, is_last_rank=True,
                                       pre_num_ranks=0, post_num_ranks=0)
        x = [torch.randn(1, 8, 2, 8, requires_grad=True) for _ in range(3)]
        g, beta = -torch.rand(1, 8, 2, 8), torch.rand(1, 8, 2)
        cap = kcp_dump.KernelCapture(fla_standin.chunk_kda, os.path.join(self.dir.name, "x.h5"),
                                     cp_global_cu_seqlens=[0, 5, 16], attrs=dict(cp_size=2, cp_rank=1))
        with self.assertRaisesRegex(ValueError, r"gives rank 1's local cu_seqlens \[0, 8\], but cp_context has \[0, 4, 8\]"):
            cap(*x, g, beta, cp_context=ctx)
        cap = kcp_dump.KernelCapture(fla_standin.chunk_kda, os.path.join(self.dir.name, "y.h5"),
                                     cp_global_cu_seqlens=[0, 5, 15], attrs=dict(cp_size=2, cp_rank=1))
        with self.assertRaisesRegex(ValueError, r"must run from 0 to cp_size \* T_local = 2 \* 8"):
            cap(*x, g, beta, cp_context=ctx)


if __name__ == "__main__":
    unittest.main(verbosity=2)

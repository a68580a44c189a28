"""scripts/bench_fla_backward.py's shape and row handling, checked against the kcp executable (ctest
label tools; plain python3, no torch: FLA itself runs only on the GPU machine).

Covers: a packed shape var:T:H:N parses to the T column `kcp bench --seqs N` prints (NxL), equal_cu
cuts T as app/bench.cpp does (the first T % N sequences one token longer), and kcp_rows reads the
rows kcp bench prints (plain and packed) under the keys the FLA table looks up, so that the FLA /
kcp ratio of a packed shape finds kcp's row.
"""
import importlib.util
import os
import subprocess
import tempfile
import unittest

KCP = os.environ.get("KCP_BIN", "kcp")
SCRIPT = os.path.join(os.path.dirname(__file__), "..", "..", "scripts", "bench_fla_backward.py")
spec = importlib.util.spec_from_file_location("bench_fla_backward", SCRIPT)
bfb = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bfb)


def kcp_bench_rows(T, seqs):
    """kcp bench's table rows (cpu-chunkwise, a small kda problem) for T tokens as `seqs` sequences."""
    r = subprocess.run([KCP, "bench", "--backend", "cpu-chunkwise", "--variant", "kda", "--T", str(T), "--seqs",
                        str(seqs), "--H", "1", "--K", "32", "--V", "32", "--warmup", "0", "--repeat", "1", "--check",
                        "0"], capture_output=True, text=True)
    if r.returncode != 0:
        raise AssertionError(f"kcp bench failed ({r.returncode}): {r.stderr}")
    return [line for line in r.stdout.splitlines() if line.startswith("| kda |")]


class BenchFlaScript(unittest.TestCase):
    def test_parse_shape(self):
        self.assertEqual(bfb.parse_shape("kda:32768:16:16"), ("kda", 32768, 16, 16, "16x2048"))
        self.assertEqual(bfb.parse_shape("gdn:8192:16"), ("gdn", 8192, 16, 1, "8192"))

    def test_equal_cu(self):
        self.assertEqual(bfb.equal_cu(130, 3), [0, 44, 87, 130])
        self.assertEqual(bfb.equal_cu(32768, 16), [2048 * i for i in range(17)])

    def test_rows_found_under_the_shape_label(self):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "kcp_fwd.txt")
            with open(path, "w") as f:
                for T, seqs in ((130, 3), (130, 1)):
                    f.write("\n".join(kcp_bench_rows(T, seqs)) + "\n")
            rows = bfb.kcp_rows(path)
        for shape in ("kda:130:1:3", "kda:130:1"):
            var, T, H, seqs, label = bfb.parse_shape(shape)
            self.assertIn((var, label, H), rows, f"{shape}: kcp's row under {label} (rows: {sorted(rows)})")
            self.assertGreater(rows[(var, label, H)][0], 0.0)


if __name__ == "__main__":
    unittest.main()

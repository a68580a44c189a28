// FLA's per-rank CP transitions in a rank file judged against the oracle (validation/cp_transition_check.h):
// rank files cut from a seeded packed case (tests/io/io_fixtures.h dump_shard), with transitions
// stored as FLA gathers them (forward (S_ext | M) of the last local sequence unless it ends on the
// rank, backward (dS_ext | M^T) of the first unless it starts there, zeros otherwise), computed by
// cpu-chunkwise in float32 (another algorithm and precision than the float64 token-recurrence oracle).
// Such files pass; M transposed, S_ext scaled by 1.01, zeros where FLA computes, or a transition in a
// file that is not a rank file fail, naming the transition; `kcp check` prints the rows (KCP_BIN).
// Seeded (KCP_SEED).
#include <doctest/doctest.h>

#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>

#include "io/dump_call.h"
#include "tests/io/io_fixtures.h"
#include "validation/cases.h"
#include "validation/cp_transition_check.h"
#include "validation/registry.h"

using namespace kcp;

namespace {

val::CaseSpec transition_case(Variant v, uint64_t seed) {
  val::CaseSpec s;
  s.variant = v, s.seqlens = {5, 13, 6}, s.H = s.HV = 2, s.K = s.V = 8;  // P = 3: ranks [0,8) [8,16) [16,24)
  s.initial_state = s.final_state = false, s.seed = val::seed_from_env(seed);
  if (v == Variant::kda) s.flags.use_gate_in_kernel = s.flags.use_qk_l2norm_in_kernel = true;
  return s;
}

// Rank r of P with /debug/cp_transition_fwd and _bwd as FLA stores them ([HV,K,V+K] float32).
io::Dump rank_file(const io::Dump& global, int64_t r, int64_t P) {
  io::Dump d = test::dump_shard(global, r, P, true);
  const io::OpCall call = io::dump_op_call(d, DType::f32);
  const Problem& p = call.problem;
  const std::unique_ptr<Backend> be = val::backend_create("cpu-chunkwise");
  io::DumpGroup& g = d.add_group("debug");
  for (bool bwd : {false, true}) {
    Tensor<double> packed({p.HV, p.K, p.V + p.K});
    if (bwd ? !call.placement.is_first_rank : !call.placement.is_last_rank) {
      const val::SeqTransition t =
          val::sequence_transition(*be, p, call.inputs, call.cotangents.d_o, bwd ? 0 : p.N - 1, bwd);
      for (int64_t h = 0; h < p.HV; ++h)
        for (int64_t i = 0; i < p.K; ++i) {
          for (int64_t j = 0; j < p.V; ++j) packed(h, i, j) = t.s(h, i, j);
          for (int64_t j = 0; j < p.K; ++j) packed(h, i, p.V + j) = t.m(h, i, j);
        }
    }
    g.add(bwd ? val::kTransitionBwd : val::kTransitionFwd, test::array_of(packed, DType::f32), DType::f32);
  }
  return d;
}

// tensor -> PASS / FAIL / SKIP, as kcp check would judge it (a problem counts as FAIL).
std::map<std::string, std::string> verdicts(const io::Dump& d) {
  const std::unique_ptr<Backend> oracle = val::backend_create("cpu-recurrent");
  std::map<std::string, std::string> v;
  for (const val::TransitionPair& p : val::cp_transition_pairs(*oracle, d, DType::f64)) {
    if (!p.skip.empty()) v[p.tensor] = "SKIP";
    else if (!p.problem.empty()) v[p.tensor] = "FAIL";
    else v[p.tensor] = std::string(val::verdict_name(val::judge(val::compare(p.candidate.view(), p.oracle.view()), p.bar)));
  }
  return v;
}

// Applies f to the stored element of /debug/<name> as a Tensor<double> [HV,K,V+K], stored back as float32.
template <class F>
void edit(io::Dump& d, const char* name, F f) {
  for (io::DumpGroup& g : d.groups)
    for (io::DumpDataset& x : g.datasets)
      if (g.name == "debug" && x.name == name) {
        Tensor<double> t = to_tensor<double>(x.data.view());
        f(t);
        x.data = test::array_of(t, DType::f32);
      }
}

void transpose_m(Tensor<double>& t) {
  const int64_t K = t.dim(1), V = t.dim(2) - K;
  for (int64_t h = 0; h < t.dim(0); ++h)
    for (int64_t i = 0; i < K; ++i)
      for (int64_t j = 0; j < i; ++j) std::swap(t(h, i, V + j), t(h, j, V + i));
}

void scale_s(Tensor<double>& t) {
  const int64_t K = t.dim(1), V = t.dim(2) - K;
  for (int64_t h = 0; h < t.dim(0); ++h)
    for (int64_t i = 0; i < K; ++i)
      for (int64_t j = 0; j < V; ++j) t(h, i, j) *= 1.01;
}

const std::map<std::string, std::string> kAllPass = {{"cp_transition_fwd.S", "PASS"}, {"cp_transition_fwd.M", "PASS"},
                                                     {"cp_transition_bwd.dS", "PASS"},
                                                     {"cp_transition_bwd.MT", "PASS"}};

}  // namespace

TEST_CASE("FLA-style transitions of every rank pass; FLA's zeros are skipped where it computes none") {
  for (Variant v : {Variant::gdn, Variant::kda}) {
    const val::CaseSpec s = transition_case(v, 41);
    INFO(s.name());
    const io::Dump global = test::dump_from_case(val::make_case(s));
    const auto r0 = verdicts(rank_file(global, 0, 3)), r1 = verdicts(rank_file(global, 1, 3)),
               r2 = verdicts(rank_file(global, 2, 3));
    CHECK(r0 == std::map<std::string, std::string>{{"cp_transition_fwd.S", "PASS"}, {"cp_transition_fwd.M", "PASS"},
                                                   {"cp_transition_bwd.dS", "SKIP"}, {"cp_transition_bwd.MT", "SKIP"}});
    CHECK(r1 == kAllPass);  // a middle rank: one sequence piece, both directions
    CHECK(r2 == std::map<std::string, std::string>{{"cp_transition_fwd.S", "SKIP"}, {"cp_transition_fwd.M", "SKIP"},
                                                   {"cp_transition_bwd.dS", "PASS"}, {"cp_transition_bwd.MT", "PASS"}});
  }
}

TEST_CASE("a wrong transition fails, naming it") {
  const val::CaseSpec s = transition_case(Variant::gdn, 42);
  INFO(s.name());
  const io::Dump global = test::dump_from_case(val::make_case(s));
  const io::Dump good = rank_file(global, 1, 3);
  io::Dump d = good;
  edit(d, val::kTransitionFwd, transpose_m);
  auto v = verdicts(d);
  CHECK(v["cp_transition_fwd.M"] == "FAIL");
  CHECK(v["cp_transition_fwd.S"] == "PASS");
  d = good, edit(d, val::kTransitionBwd, transpose_m);  // M where FLA gathers M^T
  CHECK(verdicts(d)["cp_transition_bwd.MT"] == "FAIL");
  d = good, edit(d, val::kTransitionFwd, scale_s);
  CHECK(verdicts(d)["cp_transition_fwd.S"] == "FAIL");
  d = good, edit(d, val::kTransitionBwd, scale_s);
  CHECK(verdicts(d)["cp_transition_bwd.dS"] == "FAIL");
  d = good, edit(d, val::kTransitionBwd, [](Tensor<double>& t) { t = Tensor<double>(t.shape()); });
  v = verdicts(d);  // zeros where FLA must compute: the next rank would start from nothing
  CHECK(v["cp_transition_bwd.dS"] == "FAIL");
  CHECK(v["cp_transition_bwd.MT"] == "FAIL");
  // a transition stored in a file that is not a rank file, or of the wrong shape
  d = test::dump_from_case(val::make_case(s));
  d.add_group("debug") = *good.group("debug");
  CHECK(verdicts(d)["cp_transition_fwd.S"] == "FAIL");
  d = good, edit(d, val::kTransitionFwd, [](Tensor<double>& t) { t = Tensor<double>({1, 2, 3}); });
  CHECK(verdicts(d)["cp_transition_fwd.M"] == "FAIL");
}

namespace {

// The start of kcp check's row for debug/<tensor> (app/report.cpp: group in 13 columns).
std::string row_of(const char* tensor) {
  char buf[80];
  std::snprintf(buf, sizeof buf, "  %-13s %s ", val::kTransitionGroup, tensor);
  return buf;
}

// `kcp check FILE` (KCP_BIN, set by ctest): exit status and stdout.
std::pair<int, std::string> kcp_check(const std::string& file, const test::TempDir& dir) {
  const char* bin = std::getenv("KCP_BIN");
  REQUIRE_MESSAGE(bin, "KCP_BIN is set by ctest");
  const std::string out = dir.file("out.txt");
  const int status = std::system((std::string(bin) + " check " + file + " > " + out + " 2>&1").c_str());
  std::ifstream f(out);
  std::stringstream text;
  text << f.rdbuf();
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, text.str()};
}

}  // namespace

TEST_CASE("kcp check prints the transition rows of a rank file and fails a wrong one") {
  test::TempDir dir("cp_transition_cli");
  // gdn: its decay (U(-0.3, -0.001) per token) leaves M of order 0.3 over the 8 tokens; kda's fused gate
  // (about -5 per token) makes M ~1e-20, which FLA's absolute rule passes whatever its orientation
  const val::CaseSpec s = transition_case(Variant::gdn, 43);
  INFO(s.name());
  const io::Dump global = test::dump_from_case(val::make_case(s));
  io::Dump d = rank_file(global, 1, 3);
  io::dump_write(dir.file("good.h5"), d);
  const auto good = kcp_check(dir.file("good.h5"), dir);
  INFO(good.second);
  CHECK(good.first == 0);
  for (const char* t : val::kTransitionRows) CHECK(good.second.find(row_of(t)) != std::string::npos);
  edit(d, val::kTransitionFwd, transpose_m);
  io::dump_write(dir.file("bad.h5"), d);
  const auto bad = kcp_check(dir.file("bad.h5"), dir);
  INFO(bad.second);
  CHECK(bad.first == 1);
  const size_t row = bad.second.find(row_of("cp_transition_fwd.M"));
  REQUIRE(row != std::string::npos);
  CHECK(bad.second.substr(row, bad.second.find('\n', row) - row).find("FAIL") != std::string::npos);
}

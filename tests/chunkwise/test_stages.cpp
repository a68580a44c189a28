// Stage-level checks of the chunkwise algorithm (reference/chunkwise.h), float64, one head at a time:
//   solve_tril: P (I + Lmat) = I for every chunk; WY backward: FLA's dw and dP forms agree;
//   state:      h[c] equals the recurrence's state after c*C tokens, and dh[c] equals the
//               recurrence's gradient w.r.t. the state after chunk c (its backward over the rest);
//               the separate stages state and output equal the fused chunk_state_output;
//   gate:       the reverse cumsum of FLA's single dB equals the assembled da (mild gates);
//   intra:      gated_gram / gated_gram_backward equal direct sums with exp(B_r - B_s), including da
//               as rectangle sums, with decays strong enough to overflow a naive factorization;
//   traces:     the trace entry points give bitwise what the per-head algorithm gives;
//   backend:    bitwise identical results for 1 and 2 threads; supports() names the chunk sizes.
// Bars: tolerance.h kIdentityF64 (identities along different float64 paths), kExactF64 (algorithms).
#include <doctest/doctest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>

#include "core/rng.h"
#include "reference/chunkwise.h"
#include "reference/chunkwise_intra.h"
#include "reference/recurrent.h"
#include "tests/chunkwise/cw_support.h"
#include "validation/registry.h"
#include "validation/tolerance.h"

using namespace kcp;
using namespace kcp::ref;

namespace {

double rel(const Mat<double>& a, const Mat<double>& b) {
  REQUIRE(b.norm() > 0);  // a zero reference would make the check vacuous
  return (a - b).norm() / b.norm();
}

// Rows [t0, t0+len) of a head, as a head of its own starting from h0.
HeadData<double> head_rows(const HeadData<double>& d, int64_t t0, int64_t len, const Mat<double>& h0) {
  HeadData<double> r = d;
  r.seq.t0 += t0, r.seq.len = len;
  r.q = d.q.middleRows(t0, len), r.k = d.k.middleRows(t0, len), r.v = d.v.middleRows(t0, len);
  r.a = d.a.middleRows(t0, len);
  if (d.beta.size()) r.beta = d.beta.segment(t0, len);
  r.h0 = h0;
  return r;
}

std::vector<val::CaseSpec> stage_cases() {
  std::vector<val::CaseSpec> out;
  for (Variant var : {Variant::gdn, Variant::kda, Variant::gla})
    for (int64_t C : {16, 32, 64}) {
      val::CaseSpec s;
      s.variant = var, s.chunk_size = C, s.T = 3 * C + 5, s.H = s.HV = 1, s.K = 12, s.V = 10;
      s.flags.use_beta_sigmoid_in_kernel = s.flags.allow_neg_eigval = var != Variant::gla;
      s.seed = uint64_t(val::seed_from_env(700)) + out.size();
      out.push_back(s);
    }
  return out;
}

struct HeadCase {
  Problem p;
  HeadData<double> d;
  Mat<double> d_o, dht;
};

HeadCase head_case(const val::CaseData& c) {
  HeadCase h{c.problem(), {}, {}, {}};
  h.d = load_head<double>(h.p, c.inputs(), 0, 0);
  h.d_o = load_rows<double>(c.d_o.view(), h.d.seq, 0, h.p.V);
  h.dht = load_state<double>(c.dht.view(), 0, 0, h.p.K, h.p.V, false);
  return h;
}

// The separate stages state and output give what the fused chunk_state_output gave the trace.
void check_separate_state_output(const Problem& p, const ChunkwiseTrace<double>& t, int64_t c) {
  const size_t ci = size_t(c);
  Mat<double> vnew, h_out;
  chunk_state(t.chunk[ci], t.h[ci], vnew, h_out);
  CHECK(rel(vnew, t.vnew[ci]) < val::tol::kExactF64);
  CHECK(rel(h_out, ci + 1 < t.h.size() ? t.h[ci + 1] : t.ht) < val::tol::kExactF64);
  CHECK(rel(chunk_output(t.chunk[ci], t.h[ci], vnew, p.scale), t.o[ci]) < val::tol::kExactF64);
}

}  // namespace

TEST_CASE("chunkwise stages: P inverts I + Lmat, h[c] and dh[c] match the recurrence, FLA's dB") {
  for (const val::CaseSpec& s : stage_cases()) {
    SUBCASE(s.name().c_str()) {
      const HeadCase hc = head_case(val::make_case(s));
      const Problem& p = hc.p;
      const HeadData<double>& d = hc.d;
      const int64_t L = d.seq.len, C = p.chunk_size, NT = chunk_count(L, C);
      const ChunkwiseTrace<double> t = chunkwise_forward_trace(p, d);
      const ChunkwiseBackwardTrace<double> b = chunkwise_backward_trace(p, d, hc.d_o, hc.dht);
      REQUIRE(int64_t(t.chunk.size()) == NT);
      for (int64_t c = 0; c < NT; ++c) {
        INFO("chunk ", c);
        const ChunkLocal<double>& loc = t.chunk[size_t(c)];
        const ChunkSpan sp = chunk_span(L, C, c);
        if (p.delta_rule()) {
          const Mat<double> I = Mat<double>::Identity(sp.len, sp.len);
          CHECK(rel(Mat<double>(loc.P * (I + loc.Lmat)), I) < val::tol::kIdentityF64);
        }
        Mat<double> o, ht;  // the recurrence over the first c*C tokens, and over the rest
        recurrent_forward_head(p, head_rows(d, 0, sp.t0, d.h0), o, ht);
        CHECK(rel(t.h[size_t(c)], ht) < val::tol::kExactF64);
        check_separate_state_output(p, t, c);
        HeadGrads<double> g;
        const int64_t rest = L - sp.t0 - sp.len;
        const Mat<double> h_next = c + 1 < NT ? t.h[size_t(c + 1)] : t.ht;
        recurrent_backward_head(p, head_rows(d, sp.t0 + sp.len, rest, h_next), Mat<double>(hc.d_o.bottomRows(rest)),
                                hc.dht, g);
        CHECK(rel(b.dh[size_t(c)], g.dh0) < val::tol::kExactF64);
        if (p.delta_rule()) {  // FLA's dw and its dP form give what the WY backward forms more cheaply
          const ChunkInputs<double> x = chunk_inputs(d, sp);
          const Mat<double> kb = x.beta.asDiagonal() * gate_mul(x.k, loc.gate.gamma), vb = x.beta.asDiagonal() * x.v;
          const ChunkBackward<double>& bw = b.chunk[size_t(c)];
          const Mat<double> Pt_dw = loc.P.transpose() * bw.dw;
          const Mat<double> dP_fla = bw.dw * kb.transpose() + bw.dvnew * vb.transpose();
          CHECK(rel(bw.dXw, Pt_dw) < val::tol::kIdentityF64);
          if (sp.len > 1)
            CHECK(rel(bw.dP, Mat<double>(dP_fla.triangularView<Eigen::StrictlyLower>())) < val::tol::kIdentityF64);
        }
        // FLA's single dB per chunk, reverse-cumsummed, is the gate gradient (mild gates: no cancellation)
        const ChunkBackward<double>& bc = b.chunk[size_t(c)];
        Mat<double> dB = bc.dB_intra;
        dB += fla_dB_inter(ChunkInterGrads<double>{bc.dq_inter, bc.dk_inter, bc.dB_q, bc.dB_kg, bc.dB_all});
        if (p.delta_rule()) dB += bc.dB_wy;
        const Mat<double> zero = Mat<double>::Zero(dB.rows(), dB.cols());
        const Mat<double> da = chunk_gate_cumsum_backward(dB, zero, RowVec<double>(RowVec<double>::Zero(dB.cols())));
        CHECK(rel(da, Mat<double>(b.grads.da.middleRows(sp.t0, sp.len))) < val::tol::kExactF64);
      }
      // the traces run the same code as the per-head algorithm
      Mat<double> o, ht;
      chunkwise_forward_head(p, d, o, ht);
      CHECK(ht == t.ht);
      for (int64_t c = 0; c < NT; ++c) CHECK(o.middleRows(c * C, t.o[size_t(c)].rows()) == t.o[size_t(c)]);
      HeadGrads<double> g;
      chunkwise_backward_head(p, d, hc.d_o, hc.dht, g);
      CHECK(g.dq == b.grads.dq);
      CHECK(g.dk == b.grads.dk);
      CHECK(g.da == b.grads.da);
      CHECK(g.dh0 == b.grads.dh0);
    }
  }
}

namespace {

// A chunk of `len` rows with log decays U(lo, 0) per channel (Kg = K) or per row (Kg = 1).
struct GramCase {
  Mat<double> X, Y, M, a;
};

GramCase gram_case(int64_t len, int64_t K, int64_t Kg, double lo, uint64_t seed) {
  const CounterRng rng{seed, 1};
  uint64_t i = 0;
  auto fill = [&](int64_t r, int64_t c, double a0, double a1) {
    Mat<double> m(r, c);
    for (int64_t x = 0; x < m.size(); ++x) m.data()[x] = rng.uniform(i++, a0, a1);
    return m;
  };
  return {fill(len, K, -1, 1), fill(len, K, -1, 1), fill(len, len, -1, 1), fill(len, Kg, lo, 0)};
}

// Direct sums: D_rs = exp(B_r - B_s) formed per element from a float64 cumsum.
double decay(const Mat<double>& B, int64_t r, int64_t s, int64_t d) {
  const int64_t col = B.cols() == 1 ? 0 : d;
  return std::exp(B(r, col) - B(s, col));
}

}  // namespace

TEST_CASE("gated intra-chunk products equal direct sums under decays that overflow a naive factorization") {
  const uint64_t seed = val::seed_from_env(800);
  for (int64_t Kg : {int64_t(1), int64_t(6)})
    for (int64_t len : {1, 15, 16, 17, 40, 64}) {
      const int64_t K = 6;
      SUBCASE(("Kg=" + std::to_string(Kg) + ",len=" + std::to_string(len)).c_str()) {
        const GramCase gc = gram_case(len, K, Kg, -40.0, seed + uint64_t(len * 10 + Kg));
        const ChunkGate<double> g = chunk_gate_cumsum(gc.a);
        Mat<double> B = gc.a;
        for (int64_t r = 1; r < len; ++r) B.row(r) += B.row(r - 1);
        Mat<double> A = Mat<double>::Zero(len, len), dX = Mat<double>::Zero(len, K), dY = dX;
        Mat<double> da = Mat<double>::Zero(len, Kg);
        for (int64_t r = 0; r < len; ++r)
          for (int64_t s = 0; s <= r; ++s)
            for (int64_t d = 0; d < K; ++d) {
              const double D = decay(B, r, s, d), T = gc.M(r, s) * gc.X(r, d) * gc.Y(s, d) * D;
              A(r, s) += gc.X(r, d) * gc.Y(s, d) * D;
              dX(r, d) += gc.M(r, s) * gc.Y(s, d) * D;
              dY(s, d) += gc.M(r, s) * gc.X(r, d) * D;
              for (int64_t t = s + 1; t <= r; ++t) da(t, Kg == 1 ? 0 : d) += T;  // pairs r >= t > s
            }
        const Mat<double> Ag = gated_gram(gc.X, gc.Y, g, true);
        const GramGrads<double> gg = gated_gram_backward(gc.M, gc.X, gc.Y, g, true);
        CHECK(Ag.allFinite());
        CHECK(gg.dX.allFinite());
        CHECK(gg.dY.allFinite());
        CHECK(gg.da.allFinite());
        CHECK(rel(Ag, A) < val::tol::kIdentityF64);
        CHECK(rel(gg.dX, dX) < val::tol::kIdentityF64);
        CHECK(rel(gg.dY, dY) < val::tol::kIdentityF64);
        if (len > 1) CHECK(rel(gg.da, da) < val::tol::kIdentityF64);
        const Mat<double> As = gated_gram(gc.X, gc.Y, g, false);  // the strict variant drops the diagonal
        if (len > 1) CHECK(rel(As, Mat<double>(A.triangularView<Eigen::StrictlyLower>())) < val::tol::kIdentityF64);
        else CHECK(As.isZero(0));
      }
    }
}

TEST_CASE("cpu-chunkwise is bitwise identical for 1 and 2 threads") {
  val::CaseSpec s;
  s.variant = Variant::kda, s.seqlens = {70, 1, 33, 0, 129}, s.H = 2, s.HV = 4, s.K = 16, s.V = 12, s.chunk_size = 32;
  s.flags.use_gate_in_kernel = true, s.flags.lower_bound = -2.0;
  s.seed = val::seed_from_env(900);
  const val::CaseData c = val::make_case(s);
  const int before = omp_get_max_threads();
  omp_set_num_threads(1);
  const auto one = test::run_backend<double>("cpu-chunkwise", c);
  omp_set_num_threads(2);
  const auto two = test::run_backend<double>("cpu-chunkwise", c);
  omp_set_num_threads(before);
  for (const test::TensorErr& e : test::compare_runs(one, two)) {
    INFO(e.name);
    CHECK(e.rel == 0);
  }
}

TEST_CASE("cpu-chunkwise supports exactly the chunk sizes it dispatches on") {
  val::CaseSpec s;
  s.T = 20;
  for (int64_t C : {1, 8, 16, 24, 32, 48, 64, 128}) {
    s.chunk_size = C;
    const val::CaseData c = val::make_case(s);
    const Problem p = c.problem();
    auto be = val::backend_create("cpu-chunkwise");
    const Support sup = be->supports(p);
    const auto& sizes = kChunkwiseChunkSizes;
    const bool listed = std::find(sizes.begin(), sizes.end(), C) != sizes.end();
    INFO("chunk_size ", C, ": ", sup.reason);
    CHECK(bool(sup) == listed);
    CHECK(listed == (C == 16 || C == 32 || C == 64));
    if (!listed) {
      CHECK(sup.reason.find("16, 32, 64") != std::string::npos);
      auto out = val::make_outputs<double>(p, true);
      CHECK_THROWS_AS(be->forward(p, c.inputs(), out.views()), Error);
    }
  }
}

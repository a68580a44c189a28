// plan_segments and the segment options (see plan.h).
#include "segment/plan.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "core/error.h"

namespace kcp::seg {
namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

struct Seq {
  int64_t start, len;  // over the B*T tokens
};

std::vector<Seq> sequences(const Problem& p) {
  std::vector<Seq> v;
  for (int64_t n = 0; n < p.N; ++n) {
    const SeqRange r = p.sequence(n);
    v.push_back({r.b * p.T + r.t0, r.len});
  }
  return v;
}

// Cuts every sequence longer than `piece` tokens: into pieces of exactly `piece` (forced), or into
// ceil(len / piece) pieces of equal chunk counts (balanced); the last piece takes the rest.
SegmentPlan layout(const Problem& p, const std::vector<Seq>& seqs, int64_t piece, bool balanced) {
  const int64_t C = p.chunk_size;
  SegmentPlan pl;
  pl.segment_tokens = piece;
  pl.cu = {0};
  pl.seq_seg = {0};
  int64_t first_cut = -1, last_cut = -1;
  for (size_t n = 0; n < seqs.size(); ++n) {
    const Seq& s = seqs[n];
    int64_t step = s.len;  // unsplit: one segment
    if (s.len > piece) {
      step = piece;
      if (balanced) {
        const int64_t chunks = ceil_div(s.len, C);
        step = ceil_div(chunks, ceil_div(chunks, piece / C)) * C;
      }
    }
    const int64_t pieces = s.len > piece ? ceil_div(s.len, step) : 1;
    if (pieces > 1) {
      if (first_cut < 0) first_cut = int64_t(pl.cu.size()) - 1;
      last_cut = int64_t(pl.cu.size()) - 1 + pieces - 1;  // its last segment: no transition needed
      ++pl.split_sequences;
      pl.longest_split = std::max(pl.longest_split, pieces);
    }
    for (int64_t k = 1; k < pieces; ++k) pl.cu.push_back(s.start + k * step);
    pl.cu.push_back(s.start + s.len);
    pl.seq_seg.push_back(int64_t(pl.cu.size()) - 1);
  }
  pl.split = pl.split_sequences > 0;
  if (pl.split) pl.transition_first = first_cut, pl.transition_count = last_cut - first_cut;
  return pl;
}

// The model of plan.h in chunk steps; `pl` unsplit means every sequence whole.
double model_cost(const Problem& p, const std::vector<Seq>& seqs, const SegmentPlan& pl, int sms,
                  const SegmentOptions& o) {
  const int64_t C = p.chunk_size, bv = std::max<int64_t>(1, o.value_tile);
  const double slots = double(std::max(1, sms)) * std::max(1, o.blocks_per_sm);
  const double tiles_f = double(ceil_div(p.V, bv)) * double(p.HV), tiles_t = double(ceil_div(p.V + p.K, bv)) * double(p.HV);
  auto phase = [&](double chain, double work) { return std::max(chain, work / slots); };
  if (!pl.split) {
    double chain = 0, work = 0;
    for (const Seq& s : seqs) chain = std::max(chain, double(ceil_div(s.len, C))), work += double(ceil_div(s.len, C));
    return phase(chain, work * tiles_f);
  }
  double chain_f = 0, work_f = 0, chain_t = 0, work_t = 0;
  for (int64_t i = 0; i + 1 < int64_t(pl.cu.size()); ++i) {
    const double ch = double(ceil_div(pl.cu[size_t(i) + 1] - pl.cu[size_t(i)], C));
    chain_f = std::max(chain_f, ch), work_f += ch;
    if (i >= pl.transition_first && i < pl.transition_first + pl.transition_count)
      chain_t = std::max(chain_t, ch), work_t += ch;
  }
  return phase(chain_t * o.transition_cost, work_t * tiles_t * o.transition_cost) +
         double(pl.longest_split) * o.scan_cost + phase(chain_f, work_f * tiles_f) + o.fixed_cost;
}

std::string fmt(const char* f, double a, double b = 0, double c = 0) {
  char buf[256];
  std::snprintf(buf, sizeof buf, f, a, b, c);
  return buf;
}

}  // namespace

SegmentOptions parse_segment_option(std::string_view text, std::string_view what) {
  SegmentOptions o;
  if (text.empty() || text == "auto") return o;
  if (text == "off" || text == "0") {
    o.mode = SegmentMode::off;
    return o;
  }
  const std::string s(text);
  char* end = nullptr;
  const long long v = std::strtoll(s.c_str(), &end, 10);
  KCP_CHECK(end && *end == '\0' && v > 0, what, ": expected auto, off or a positive segment length in tokens, got '",
            text, "'");
  o.mode = SegmentMode::forced;
  o.forced_tokens = v;
  return o;
}

SegmentOptions segment_options_from_env(const char* variable) {
  const char* e = std::getenv(variable);
  return parse_segment_option(e ? std::string_view(e) : std::string_view(), variable);
}

SegmentPlan plan_segments(const Problem& p, int sms, const SegmentOptions& o) {
  const int64_t C = p.chunk_size;
  const std::vector<Seq> seqs = sequences(p);
  SegmentPlan none;
  none.est_unsplit = model_cost(p, seqs, none, sms, o);
  if (o.mode == SegmentMode::off) return none.reason = "segmenting off", none;
  if (o.mode == SegmentMode::forced) {
    KCP_CHECK(o.forced_tokens > 0, "segment: a forced segment length must be positive, got ", o.forced_tokens);
    const int64_t piece = ceil_div(o.forced_tokens, C) * C;
    SegmentPlan pl = layout(p, seqs, piece, false);
    if (!pl.split) return none.reason = fmt("forced %.0f tokens: no sequence is longer", double(piece)), none;
    pl.est_unsplit = none.est_unsplit, pl.est_split = model_cost(p, seqs, pl, sms, o);
    pl.reason = fmt("forced %.0f tokens", double(piece));
    return pl;
  }
  int64_t longest = 0;
  for (const Seq& s : seqs) longest = std::max(longest, ceil_div(s.len, C));
  SegmentPlan best;
  for (int64_t chunks = std::max<int64_t>(1, o.min_segment_chunks); chunks < longest; chunks *= 2) {
    SegmentPlan pl = layout(p, seqs, chunks * C, true);
    if (!pl.split) continue;
    pl.est_split = model_cost(p, seqs, pl, sms, o);
    if (!best.split || pl.est_split < best.est_split) best = pl;
  }
  const std::string blocks = fmt("%.0f blocks (sequences x HV x V/BV) on %.0f slots", double(seqs.size()) *
                                     double(p.HV) * double(ceil_div(p.V, std::max<int64_t>(1, o.value_tile))),
                                 double(std::max(1, sms)) * std::max(1, o.blocks_per_sm));
  if (!best.split) {
    none.reason = fmt("no sequence longer than %.0f chunks; ", double(o.min_segment_chunks)) + blocks;
    return none;
  }
  best.est_unsplit = none.est_unsplit;
  if (best.est_split > none.est_unsplit * (1 - o.min_gain)) {
    none.est_split = best.est_split;
    none.reason = fmt("does not pay: best cut %.0f tokens costs %.0f vs %.0f steps unsplit; ",
                      double(best.segment_tokens), best.est_split, none.est_unsplit) + blocks;
    return none;
  }
  best.reason = "automatic; " + blocks;
  return best;
}

std::string SegmentPlan::describe() const {
  if (!split) return "unsplit (" + reason + ")";
  return fmt("split: %.0f sequences cut into segments of <= %.0f tokens, %.0f segments in all", double(split_sequences),
             double(segment_tokens), double(segments())) +
         fmt(" (up to %.0f per sequence); calls: transition_forward over %.0f segments, 1 scan, ", double(longest_split),
             double(transition_count)) +
         fmt("forward over %.0f segments; model %.0f vs %.0f steps unsplit", double(segments()), est_split, est_unsplit) +
         " (" + reason + ")";
}

}  // namespace kcp::seg

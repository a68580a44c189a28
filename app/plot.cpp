// plot_tensor: see plot.h.
#include "app/plot.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <sstream>

#include "app/png.h"
#include "core/error.h"

namespace kcp::app {
namespace {

constexpr int kW = 1100, kTopH = 380, kHistH = 260, kLeft = 70, kRight = 20;
constexpr Rgb kBlack{0, 0, 0}, kGrey{150, 150, 150}, kRed{220, 30, 30}, kOrange{255, 140, 0}, kBlue{40, 90, 200};
const Rgb kPalette[] = {{31, 119, 180}, {44, 160, 44}, {148, 103, 189}, {140, 86, 75}, {227, 119, 194},
                        {23, 190, 207}, {188, 189, 34}, {127, 127, 127}, {255, 127, 14}, {0, 0, 128}};

std::string sci(double x) {
  char b[32];
  std::snprintf(b, sizeof b, "%.1e", x);
  return b;
}

std::string decade(int e) { return "1E" + std::to_string(e); }

// Interior sequence starts (cu_seqlens) in global token units, and the CP-rank starts.
std::vector<int64_t> index_list(const io::Dump& d, const char* name) {
  const io::DumpGroup* in = d.group("inputs");
  const io::DumpDataset* ds = in ? in->find(name) : nullptr;
  std::vector<int64_t> out;
  if (!ds) return out;
  const Tensor<double> t = to_tensor<double>(ds->data.view());
  for (double v : t.vec()) out.push_back(int64_t(v));
  return out;
}

std::vector<int64_t> cp_starts(const io::Dump& d) {
  std::vector<int64_t> out;
  const io::AttrValue* v = io::attr_find(d.attrs, "assembled_token_offsets");
  const std::string* s = v ? std::get_if<std::string>(v) : nullptr;
  if (!s) return out;
  std::istringstream is(*s);
  for (std::string x; std::getline(is, x, ',');) out.push_back(std::stoll(x));
  return out;
}

struct TokenErrors {
  int64_t B = 0, T = 0, heads = 0;
  std::vector<double> e;  // [B*T][heads], NaN where non-finite
};

// The per-token, per-head error of plot.h, or heads = 0 when the tensor has no token axis.
TokenErrors token_errors(const Tensor<double>& a, const Tensor<double>& b, int64_t T, bool conv, double ref_rms) {
  TokenErrors te;
  const Shape& s = a.shape();
  if (s.size() < 3 || s[1] != T) return te;
  te.B = s[0], te.T = T, te.heads = conv ? 1 : s[2];
  const int64_t inner = a.numel() / (te.B * T * te.heads);
  te.e.assign(size_t(te.B * T * te.heads), 0.0);
  for (int64_t i = 0; i < te.B * T * te.heads; ++i) {
    double ss = 0;
    for (int64_t j = 0; j < inner; ++j) {
      const double d = a.data()[i * inner + j] - b.data()[i * inner + j];
      ss += d * d;
    }
    te.e[size_t(i)] = std::sqrt(ss / double(inner)) / (ref_rms + 1e-30);
  }
  return te;
}

void sequence_panel(Canvas& c, const TokenErrors& te, double bar, bool mark_first, const std::vector<int64_t>& seq_starts,
                    const std::vector<int64_t>& cp, const std::string& ylabel) {
  const int x0 = kLeft, x1 = kW - kRight, y0 = 40, y1 = kTopH - 40;
  const int64_t n = te.B * te.T;
  double lo = INFINITY, hi = bar > 0 ? bar : 0;
  for (double v : te.e)
    if (std::isfinite(v)) { if (v > 0) lo = std::min(lo, v); hi = std::max(hi, v); }
  int dlo = std::isfinite(lo) ? int(std::floor(std::log10(lo))) : -8, dhi = hi > 0 ? int(std::ceil(std::log10(hi))) : 0;
  dlo = std::max(dlo, dhi - 12);
  if (dhi - dlo < 2) dlo = dhi - 2;
  auto ypix = [&](double v) {
    if (!std::isfinite(v)) return y0;
    const double l = v > 0 ? std::clamp(std::log10(v), double(dlo), double(dhi)) : double(dlo);
    return int(std::lround(y1 - (l - dlo) / double(dhi - dlo) * (y1 - y0)));
  };
  auto xpix = [&](int64_t tok) { return x0 + int(double(tok) / double(std::max<int64_t>(n - 1, 1)) * (x1 - x0)); };
  for (int d = dlo; d <= dhi; ++d) {  // decades
    const int y = ypix(std::pow(10.0, d));
    for (int x = x0; x <= x1; x += 3) c.set(x, y, {220, 220, 220});
    c.text(x0 - 6 - Canvas::text_width(decade(d)), y - 3, decade(d), kBlack);
  }
  c.line(x0, y0, x0, y1, kBlack), c.line(x0, y1, x1, y1, kBlack);
  for (int k = 0; k <= 5; ++k) {  // token ticks
    const int64_t tok = (n - 1) * k / 5;
    c.line(xpix(tok), y1, xpix(tok), y1 + 4, kBlack);
    c.text(xpix(tok) - 10, y1 + 8, std::to_string(tok), kBlack);
  }
  c.text(x1 - Canvas::text_width("token (batch rows side by side)"), y1 + 22, "token (batch rows side by side)", kBlack);
  c.text(4, y0 - 14, ylabel, kBlack);
  for (int64_t s : seq_starts) if (s > 0 && s < n) c.dashed_vline(xpix(s), y0, y1, kGrey);
  for (int64_t b = 1; b < te.B; ++b) c.dashed_vline(xpix(b * te.T), y0, y1, kGrey, 2);
  for (size_t r = 1; r < cp.size(); ++r) {
    c.dashed_vline(xpix(cp[r]), y0, y1, kOrange, 6);
    std::string label = "CP";  // (built in two steps: GCC 12 warns falsely on "CP" + std::to_string)
    label += std::to_string(r);
    c.text(xpix(cp[r]) + 3, y0 + 2, label, kOrange);
  }
  const int cols = x1 - x0 + 1;
  for (int64_t h = 0; h < te.heads; ++h) {  // per pixel column: the largest error of its tokens
    std::vector<double> col(size_t(cols), -1);
    for (int64_t t = 0; t < n; ++t) {
      const double v = te.e[size_t(t * te.heads + h)];
      double& slot = col[size_t(xpix(t) - x0)];
      slot = std::isfinite(v) ? std::max(slot, v) : INFINITY;
    }
    int px = -1, py = 0;
    for (int x = 0; x < cols; ++x) {
      if (col[size_t(x)] < 0) continue;
      const int y = ypix(col[size_t(x)]);
      const Rgb color = std::isfinite(col[size_t(x)]) ? kPalette[h % 10] : kRed;
      if (px >= 0) c.line(x0 + px, py, x0 + x, y, color); else c.set(x0 + x, y, color);
      px = x, py = y;
    }
    std::string label = "H";  // (two steps: see the CP label)
    label += std::to_string(h);
    if (h < 16) c.text(x1 - 16 * 34 + int(h) * 34, y0 - 14, label, kPalette[h % 10]);
  }
  if (bar > 0) {
    const int y = ypix(bar);
    for (int x = x0; x <= x1; x += 6) c.line(x, y, std::min(x + 3, x1), y, kRed);
    c.text(x0 + 4, y - 10, "bar " + sci(bar), kRed);
    if (!mark_first) return;  // a passing tensor: tokens scatter around its ratio, none is "where it starts"
  }
  // Where an error starts: the first token (any head) over both the bar and 10x the median token error,
  // or not finite. Rounding noise alone (a tensor uniformly over its bar) marks nothing.
  std::vector<double> finite;
  for (double v : te.e) if (std::isfinite(v)) finite.push_back(v);
  if (!mark_first || finite.empty()) return;
  std::nth_element(finite.begin(), finite.begin() + long(finite.size() / 2), finite.end());
  const double outlier = std::max(bar, 10 * finite[finite.size() / 2]);
  for (int64_t t = 0; t < n; ++t)
    for (int64_t h = 0; h < te.heads; ++h)
      if (!(te.e[size_t(t * te.heads + h)] <= outlier)) {
        c.fill(xpix(t) - 1, y1 - 6, xpix(t) + 1, y1, kRed);
        c.text(std::min(xpix(t) + 4, x1 - 260), y1 - 12, "first > 10x median: token " + std::to_string(t % te.T) +
               (te.B > 1 ? " row " + std::to_string(t / te.T) : "") + " head " + std::to_string(h), kRed);
        return;
      }
}

void histogram_panel(Canvas& c, int top, const Tensor<double>& a, const Tensor<double>& b, const Row& row,
                     const UserBar& user) {
  const int x0 = kLeft, x1 = kW - kRight, y0 = top + 44, y1 = top + kHistH - 40;
  constexpr double kLo = -12, kHi = 3, kStep = 0.125;
  const int nb = int((kHi - kLo) / kStep);
  std::vector<int64_t> bins(size_t(nb), 0);
  int64_t exact = 0, nonfinite = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    const double x = a.data()[i], y = b.data()[i], d = std::abs(x - y);
    if (!std::isfinite(d)) { ++nonfinite; continue; }
    if (d == 0) { ++exact; continue; }
    const double scale = user.rtol ? *user.atol + *user.rtol * std::abs(y) : row.m.ref_rms;
    const double l = std::log10(d / (scale + 1e-300));
    ++bins[size_t(std::clamp(int((l - kLo) / kStep), 0, nb - 1))];
  }
  const double bar_l = user.rtol ? 0.0 : (row.ratio_bar > 0 ? std::log10(row.ratio_bar) : kHi);
  const double top_count = std::log10(1.0 + double(*std::max_element(bins.begin(), bins.end())));
  const double bw = double(x1 - x0) / nb;
  for (int k = 0; k < nb; ++k) {
    if (!bins[size_t(k)]) continue;
    const int h = int(std::log10(1.0 + double(bins[size_t(k)])) / std::max(top_count, 1e-9) * (y1 - y0));
    const bool over = kLo + (k + 1) * kStep > bar_l;
    c.fill(x0 + int(k * bw), y1 - h, x0 + int((k + 1) * bw) - 1, y1, over ? kRed : kBlue);
  }
  c.line(x0, y0, x0, y1, kBlack), c.line(x0, y1, x1, y1, kBlack);
  for (int l = int(kLo); l <= int(kHi); ++l) {
    const int x = x0 + int((l - kLo) / (kHi - kLo) * (x1 - x0));
    c.line(x, y1, x, y1 + 4, kBlack);
    c.text(x - 10, y1 + 8, decade(l), kBlack);
  }
  const int xb = x0 + int((std::min(bar_l, kHi) - kLo) / (kHi - kLo) * (x1 - x0));
  c.dashed_vline(xb, y0 - 12, y1, kRed);
  c.text(xb + 4, y0 - 14, "bar", kRed);
  c.text(x0, top + 10, std::string("element error: ") + (user.rtol ? "|d| / (atol + rtol |oracle|)" : "|d| / rms(oracle)") +
         ", count on a log scale; exact " + std::to_string(exact) + ", non-finite " + std::to_string(nonfinite), kBlack);
}

std::string safe(std::string s) {
  for (char& ch : s) if (!std::isalnum(static_cast<unsigned char>(ch)) && ch != '-' && ch != '.') ch = '_';
  return s;
}

}  // namespace

std::string plot_tensor(const std::string& dir, const io::Dump& d, const std::string& group, const std::string& tensor,
                        const TensorView& candidate, const TensorView& oracle, const Row& row, const UserBar& user) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::create_directories(dir, ec);
  KCP_CHECK(!ec, "--plot ", dir, ": cannot create the folder: ", ec.message());
  const Tensor<double> a = to_tensor<double>(candidate), b = to_tensor<double>(oracle);
  const io::DumpGroup* in = d.group("inputs");
  const io::DumpDataset* probe = in ? in->find(d.op == "conv1d" ? "x" : "v") : nullptr;
  const int64_t T = probe && probe->data.shape.size() >= 2 ? probe->data.shape[1] : -1;
  const TokenErrors te = token_errors(a, b, T, d.op == "conv1d", row.m.ref_rms);
  const int top = te.heads ? kTopH : 40;
  Canvas c(kW, top + kHistH);
  std::vector<int64_t> seqs = index_list(d, "cu_seqlens_local");
  if (seqs.empty()) seqs = index_list(d, "cu_seqlens");
  const std::string title = fs::path(d.path).filename().string() + "  /" + group + "/" + tensor + "  " + row.verdict +
                            "  fla_ratio " + sci(row.m.fla_ratio) + "  over the bar " + std::to_string(row.over) +
                            "/" + std::to_string(row.m.n);
  c.text(8, 8, title, kBlack, Canvas::text_width(title, 2) < kW - 16 ? 2 : 1);
  if (te.heads) sequence_panel(c, te, user.rtol && !user.ratio ? 0 : row.ratio_bar, row.verdict != "PASS", seqs, cp_starts(d),
                               "rms error of the token / rms(oracle), per head");
  histogram_panel(c, top, a, b, row, user);
  const std::string file = (fs::path(dir) / (safe(fs::path(d.path).stem().string()) + "__" + safe(group) + "__" +
                                             safe(tensor) + ".png")).string();
  write_png(file, c);
  std::printf("      plot: %s\n", file.c_str());
  return file;
}

}  // namespace kcp::app

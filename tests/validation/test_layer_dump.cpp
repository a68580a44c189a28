// The /layer section (validation/layer_dump.h, layer_check.h): a dump written from the layer oracle
// round-trips through HDF5 and passes every stage (float64 and float32 producers, BSHD and Megatron's
// SBHD layout); a 1% error planted in one stage (and carried through the later stages, as a buggy
// implementation would) is reported at that stage and no earlier one, in the forward and in the
// backward; a bad config attribute or a missing weight is an error naming it.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdio>

#include "tests/io/io_fixtures.h"
#include "validation/cases.h"
#include "validation/layer_check.h"

using namespace kcp;

namespace {

val::LayerCaseData first_case(const std::string& tag) {
  for (const val::LayerCase& c : val::named_layer_cases(val::seed_from_env(31)))
    if (c.tag == tag) return val::make_layer_case(c);
  throw Error("no layer case " + tag);
}

// Writes the dump, reads it back and judges it.
val::LayerCheck roundtrip(const io::Dump& d, const test::TempDir& dir, const std::string& name) {
  io::dump_write(dir.file(name), d);
  const io::Dump back = io::dump_read(dir.file(name));
  REQUIRE(val::is_layer_dump(back));
  return val::layer_check(val::read_layer_call(back));
}

// The oracle's stages and gradients with `factor` applied to stage `planted` (later stages see it).
io::Dump planted_dump(const val::LayerCaseData& d, const std::string& planted, DType stored) {
  const ref::LayerHook<double> hook = [&](const std::string& stage, Tensor<double>& t) {
    if (stage == planted)
      for (double& v : t.vec()) v *= 1.01;
  };
  const ref::LayerStages<double> st = ref::layer_forward(d.spec.config, d.params, d.in, hook);
  return val::layer_dump(d, st, nullptr, stored, "test-planted");
}

}  // namespace

TEST_CASE("layer dump: the oracle's own dump passes every stage and gradient (f64, f32, SBHD)") {
  const test::TempDir dir("layer_dump_ok");
  for (const char* tag : {"kda-megatron", "kda-split-lora", "gdn-megatron"}) {
    const val::LayerCaseData d = first_case(tag);
    const auto st = ref::layer_forward(d.spec.config, d.params, d.in);
    const auto gr = ref::layer_backward(d.spec.config, d.params, d.in, d.dout, d.dht);
    for (DType stored : {DType::f64, DType::f32}) {
      const val::LayerCheck lc = roundtrip(val::layer_dump(d, st, &gr, stored, "oracle"), dir, "ok.h5");
      INFO(tag, " stored ", dtype_name(stored));
      CHECK(lc.pairs.size() >= 15 + 1 + d.params.size());  // stages, dx, every weight gradient
      CHECK(val::layer_first_departure(lc) == -1);
    }
  }
  // Megatron's layout: token tensors [T,B,...] (B = 2 shows the transpose)
  const val::LayerCaseData d = first_case("kda-split-lora");
  const auto st = ref::layer_forward(d.spec.config, d.params, d.in);
  io::Dump dump = val::layer_dump(d, st, nullptr, DType::f64, "oracle");
  for (io::DumpGroup& g : dump.groups) {
    if (g.name != "layer") continue;
    g.attrs["layout"] = std::string("SBHD");
    for (io::DumpDataset& ds : g.datasets) {
      if (ds.name == "final_state" || ds.name == "dht" || ds.name == "initial_state") continue;
      const Tensor<double> t = to_tensor<double>(ds.data.view());
      Shape s = t.shape();
      std::swap(s[0], s[1]);
      Tensor<double> r(s);
      const int64_t row = t.numel() / (s[0] * s[1]);
      for (int64_t a = 0; a < t.dim(0); ++a)
        for (int64_t b = 0; b < t.dim(1); ++b)
          for (int64_t i = 0; i < row; ++i) r.data()[(b * t.dim(0) + a) * row + i] = t.data()[(a * t.dim(1) + b) * row + i];
      ds.data = io::array_from_view(r.view());
    }
    g.datasets.push_back({"hidden_in", io::array_from_view(to_tensor<double>(g.find("x")->data.view()).view()),
                          DType::f64, io::Encoding::ieee, {}});  // Megatron name read as an alias
    g.datasets.erase(std::find_if(g.datasets.begin(), g.datasets.end(), [](auto& x) { return x.name == "x"; }));
  }
  CHECK(val::layer_first_departure(roundtrip(dump, dir, "sbhd.h5")) == -1);
}

TEST_CASE("layer dump: an error planted in one stage is reported at that stage") {
  const test::TempDir dir("layer_dump_plant");
  const val::LayerCaseData d = first_case("kda-megatron");
  struct Plant {
    const char* tensor;
    const char* stage;
  };
  for (const Plant& p : {Plant{"qkv_proj", "in_proj"}, Plant{"g", "gate:g"}, Plant{"qkv_conv", "conv"},
                         Plant{"q", "qk_norm"}, Plant{"beta", "gate:beta"}, Plant{"a", "gate:decay"},
                         Plant{"o", "kernel"},
                         Plant{"norm_out", "out_norm"}, Plant{"y", "out_gate"}}) {
    for (DType stored : {DType::f64, DType::f32}) {
      const val::LayerCheck lc = roundtrip(planted_dump(d, p.tensor, stored), dir, "plant.h5");
      const int first = val::layer_first_departure(lc);
      INFO("planted in ", p.tensor, ", stored ", dtype_name(stored));
      REQUIRE(first >= 0);
      CHECK(lc.pairs[size_t(first)].tensor == p.tensor);
      CHECK(lc.pairs[size_t(first)].stage == p.stage);
      if (stored == DType::f32)
        std::printf("layer plant %-9s -> first departure '%s' (%s)\n", p.tensor, lc.pairs[size_t(first)].stage.c_str(),
                    lc.pairs[size_t(first)].tensor.c_str());
    }
  }
}

TEST_CASE("layer dump: an error planted in one stage's backward is reported at that stage") {
  const test::TempDir dir("layer_dump_plant_bwd");
  const val::LayerCaseData d = first_case("kda-split-lora");
  const auto st = ref::layer_forward(d.spec.config, d.params, d.in);
  struct Plant {
    const char* tensor;  // a dump name
    const char* stage;
  };
  for (const Plant& p : {Plant{"dy", "out_proj bwd"}, Plant{"do", "out_gate bwd"}, Plant{"dq", "kernel bwd"},
                         Plant{"grads/A_log", "kernel bwd"}, Plant{"dbeta_logit", "gate:beta bwd"},
                         Plant{"dqkv_conv", "qk_norm bwd"}, Plant{"dqkv_proj", "conv bwd"},
                         Plant{"grads/conv1d.weight", "conv bwd"}, Plant{"dx", "in_proj bwd"}}) {
    ref::LayerGrads<double> g = ref::layer_backward(d.spec.config, d.params, d.in, d.dout, d.dht);
    Tensor<double>* target = std::string(p.tensor) == "dx" ? &g.dx : nullptr;
    for (const auto& [name, t] : val::layer_stage_grads(g))
      if (name == p.tensor) target = const_cast<Tensor<double>*>(t);  // g is ours to change
    for (auto& [name, t] : g.dparams)
      if ("grads/" + name == p.tensor) target = &t;
    REQUIRE(target != nullptr);
    for (double& v : target->vec()) v *= 1.01;
    const val::LayerCheck lc = roundtrip(val::layer_dump(d, st, &g, DType::f32, "test-planted"), dir, "bwd.h5");
    const int first = val::layer_first_departure(lc);
    INFO("planted in ", p.tensor);
    REQUIRE(first >= 0);
    CHECK(lc.pairs[size_t(first)].tensor == p.tensor);
    CHECK(lc.pairs[size_t(first)].stage == p.stage);
  }
}

TEST_CASE("layer dump: bad config or missing weights are errors naming them") {
  const test::TempDir dir("layer_dump_bad");
  const val::LayerCaseData d = first_case("kda-megatron");
  const auto st = ref::layer_forward(d.spec.config, d.params, d.in);
  io::Dump dump = val::layer_dump(d, st, nullptr, DType::f64, "oracle");
  for (io::DumpGroup& g : dump.groups)
    if (g.name == "layer") g.attrs["output_gate"] = std::string("tanh");
  io::dump_write(dir.file("bad.h5"), dump);
  CHECK_THROWS_WITH_AS(val::read_layer_call(io::dump_read(dir.file("bad.h5"))), doctest::Contains("output_gate"),
                       Error);
  dump = val::layer_dump(d, st, nullptr, DType::f64, "oracle");
  for (io::DumpGroup& g : dump.groups)
    if (g.name == "layer/params") g.datasets.erase(g.datasets.begin());
  io::dump_write(dir.file("missing.h5"), dump);
  CHECK_THROWS_WITH_AS(val::read_layer_call(io::dump_read(dir.file("missing.h5"))), doctest::Contains("/layer/params/"),
                       Error);
}

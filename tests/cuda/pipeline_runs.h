// Two cuda::Pipeline runs of one staged case compared bit for bit (the same kernels on the same
// inputs must give the same bits): a case staged on the device once (inputs, d_o, dht and the
// gradient set to ask for), a forward (o, final state) and a backward (every gradient) downloaded
// from NaN-poisoned outputs, and the checks that two such results are equal with nothing left
// unwritten. Used by test_cuda_keep.cpp (kept against plain) and test_cuda_chunk_grid.cpp (the
// chunk table in closed form against the table).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "cuda/chunkwise.h"
#include "tests/cuda/cuda_support.h"

namespace kcp::test {

struct Staged {
  val::CaseData c;
  Problem p;
  DeviceInputs din;
  DeviceTensor d_o, dht;
  val::GradSet<double> shapes;  // what gradients to ask for, and their dtypes (device_grads)
};
Staged stage(Backend& gpu, const DtypeCase& dc);

struct Results {
  Tensor<double> o, ht;
  std::vector<std::pair<std::string, Tensor<double>>> grads;
};
// o and (when the case has one) the final state of pipe.forward.
Results run_forward(Backend& gpu, cuda::Pipeline& pipe, const Staged& s);
// pipe.backward on `in` with d_o (default the staged one) and the staged dht: its gradients into r.
void run_backward(Backend& gpu, cuda::Pipeline& pipe, const Staged& s, const Inputs& in, DType qkv, Results& r,
                  const TensorView* d_o = nullptr);

// Bit-for-bit equality of two device results (both NaN-poisoned before their runs).
void check_same(const std::string& what, const Tensor<double>& a, const Tensor<double>& b, const std::string& name);
void check_grads_same(const Results& a, const Results& b, const std::string& name);

}  // namespace kcp::test

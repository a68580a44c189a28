// Causal depthwise conv1d over packed sequences, forward and backward (ALGORITHMS.md 5.9):
//   z[t,d] = bias[d] + sum_{i<W} w[d,i] x[t-(W-1)+i, d]     (x before a sequence start is 0)
//   y = silu(z) or z
//   dz = dy * silu'(z);  dx[p,d] = sum_i w[d,i] dz[p+(W-1)-i, d];  dw[d,i] = sum_t dz[t,d] x[t-(W-1)+i,d]
// Shapes: x, y [B,T,D]; weight [D,W]; bias [D] (optional); cu_seqlens (host, B = 1) or dense rows.
// `halo` [P,D] (P <= W-1) gives the P tokens before the first sequence of the call, which
// context parallelism takes from the previous rank; its gradient comes back as `dhalo`.
// Covered by tests/reference/test_conv1d.cpp.
#pragma once

#include <vector>

#include "core/conv1d.h"

namespace kcp::ref {

using kcp::Conv1dProblem;
using kcp::make_conv1d_problem;

void conv1d_forward(const Conv1dProblem& p, const TensorView& x, const TensorView& weight, const TensorView& bias,
                    const TensorView& halo, const TensorView& y);
// dx [B,T,D]; dweight [D,W]; dbias [D] (when bias given); dhalo [P,D] (when halo given). Empty views are skipped.
void conv1d_backward(const Conv1dProblem& p, const TensorView& x, const TensorView& weight, const TensorView& bias,
                     const TensorView& halo, const TensorView& dy, const TensorView& dx, const TensorView& dweight,
                     const TensorView& dbias, const TensorView& dhalo);

}  // namespace kcp::ref

// command_help: see help.h. Keep each text in step with the command's Args list and defaults.
#include "app/help.h"

#include <cstring>

namespace kcp::app {
namespace {

struct Help {
  const char* command;
  const char* text;
};

const Help kHelp[] = {
    {"check", R"(usage: kcp check [options] PATH...
Runs the float64 oracle on each dump's /inputs (folders expand to their *.h5 files) and judges every
tensor of every result group against it (docs/GOLDEN.md for the per-tensor bars).
options:
  --backend NAME      oracle backend (default cpu-recurrent; cpu-chunkwise, cuda-chunkwise where built)
  --precision P       f64 | f32: the oracle's arithmetic (default f64)
  --select LIST       judge only these: comma-separated groups, tensors or group/tensor (default all)
  --ratio R           FLA's assert_close bar for every tensor: pass when max|d| <= 1e-6 or
                      rms(d) / (rms(oracle) + 1e-8) <= R (default: the policy's bar per tensor)
  --rtol X --atol Y   torch.testing.assert_close bar: every element |d| <= Y + X |oracle| (give both)
                      (with --ratio too, a tensor must meet both)
  --json FILE         write every verdict and measure as JSON
  --plot DIR          PNG per failing, warning or selected tensor: error along the sequence, histogram
  --write FILE        keep the dump plus the oracle's results (a folder when several PATHs)
exit status: 0 nothing failed, 1 a tensor failed, 2 a file could not be checked, 3 nothing was judged
)"},
    {"compare", R"(usage: kcp compare A.h5 B.h5 [options]
Two kcp dumps: A's result tensors against B's (inputs must be identical), kcp check's table and bars.
  (groups or datasets present on one side only: SKIP rows)
Any two HDF5 files: every dataset matched by path (h5diff -d style); one-sided datasets: FAIL rows.
options:
  --delta D           generic bar: every |a-b| <= D (default 0: identical; forces the generic mode)
  --ratio R           FLA's assert_close bar (as in kcp check)
  --rtol X --atol Y   torch.testing.assert_close bar (as in kcp check)
  --select LIST       only these groups / tensors / dataset paths
exit status: 0 equal within the bar, 1 a difference (or a one-sided plain dataset), 2 unreadable,
3 nothing compared (plain HDF5)
)"},
    {"run", R"(usage: kcp run --backend NAME --in X.h5 --out Y.h5 [--precision f64|f32]
Writes Y = X plus a result group named after the backend (producer = kcp).
options:
  --backend NAME      required (cpu-recurrent, cpu-chunkwise, cuda-chunkwise where built)
  --in X.h5 --out Y.h5  required
  --precision P       f64 | f32 (default f64)
)"},
    {"info", R"(usage: kcp info FILE
Prints a dump's attributes, decoded problem, placement, and every dataset with its storage.
)"},
    {"assemble", R"(usage: kcp assemble --out G.h5 SHARD...
Rebuilds the global dump of a TP/CP run from its per-rank files (files or folders).
options:
  --out G.h5          required
)"},
    {"bench-oracle", R"(usage: kcp bench-oracle [options]
Wall time and FLOP rate of the CPU backends, forward and forward+backward.
options:
  --variant V         gdn | kda | gla (default gdn)
  --T N --H N --K N --V N   sizes (defaults 8192, 4, 128, 128; HV = H)
  --chunk C           chunk size of cpu-chunkwise (default 64)
  --backend B         all | cpu-recurrent | cpu-chunkwise (default all)
  --precision P       both | f64 | f32 (default both)
  --repeat N          rounds (default 3)
)"},
    {"bench", R"(usage: kcp bench [options]
Forward (or forward+backward) time of a device backend: ms, GB/s, FLOP/s, roofline fraction.
options:
  --backend NAME      default cuda-chunkwise
  --backward 0|1      1: time forward+backward, gradients in FLA's dtypes (default 0)
  --transitions 0|1   1: time the CP transitions of the whole input as one rank's part instead
                      (transition_forward: S_ext, M; transition_backward: dS_ext, M^T)
  --cp-rank ROLE      first|middle|last: time one CP rank's calls without the exchange instead
                      (its transitions or prepares, then its local forward and backward), unchecked
  --fused 0|1         1 (gdn, kda): L2 norm of q, k, beta sigmoid and the softplus gate with A_log,
                      dt_bias inside the kernel (Kimi Linear's KDA call), with dA_log, ddt_bias
  --variant LIST      default gdn,kda
  --T LIST            default 8192,32768
  --H LIST            default 16,32 (HV = H)
  --K N --V N         default 128, 128
  --dtype D           default bfloat16
  --seqs LIST         the T tokens as N packed equal sequences (default 1), e.g. --T 32768 --seqs 16
  --segment S         intra-card CP plan: auto | off | <tokens> (forced length: the backward is cut too);
                      default: the backend's (cuda-chunkwise: KCP_CUDA_SEGMENT, else auto)
  --keep 0|1          1 (cuda-chunkwise): the forward keeps its intermediates for the backward that
                      follows (no recompute there); default KCP_CUDA_KEEP, else 0
  --explain           end each row with the plan the forward ran (segments, calls, model cost) and
                      the kernels it picked (cuda-chunkwise: state kernel, kda's windows, keep)
  --warmup N --repeat N --sets N   defaults 5, 50, 3
  --check 0|1         1 (default): judge each row's results against the float64 oracle (on the host)
                      before timing it; a wrong row prints WRONG and no time. 0: skip ("unchecked")
Also printed: MiB held, the device memory the row holds (inputs, outputs, gradients, workspaces).
)"},
    {"cp-sweep", R"(usage: mpirun -np N kcp cp-sweep [options]
Context parallelism against the single-process oracle over the layout matrix.
(As root add --allow-run-as-root, or export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1;
 with more ranks than cores add --oversubscribe.)
options:
  --quick             half the matrix on smaller sizes
  --backend NAME      all | a backend name (default all)
  --seed S            default 0
  --filter TEXT       only cases whose name contains TEXT
  --merge M           linear | log-depth | both (default both)
  --precision P       f64 | f32 | both (default both)
  --comm C            auto | mpi | nccl (default auto)
  --timeout SECONDS   communicator watchdog (default 600)
)"},
    {"cp-bench", R"(usage: mpirun -np N kcp cp-bench [options]
Time of the CP phases per rank count. (As root / oversubscribed: see kcp cp-sweep --help.)
options:
  --T N               tokens per rank (default 65536 on the host, 32768 on a GPU)
  --H N --K N --V N   default 4 (host) or 16 (GPU), 128, 128
  --variant V         default gdn
  --backend NAME      default cpu-chunkwise
  --dtype D           default float32 (host) or bfloat16 (GPU)
  --ranks LIST        default 1,2,4,... up to the job size
  --seqs N            sequences (default 1)
  --merge M           linear | log-depth (default linear)
  --comm C            auto | mpi | nccl (default auto)
  --repeat N          default 1
  --keep 0|1          1 (cuda-chunkwise): each rank's forward keeps its intermediates for its transitions
                      and backward (no recompute); default KCP_CUDA_KEEP, else 0
  --keep-denormals    do not flush denormals to zero
)"},
};

}  // namespace

const char* command_help(const char* command) {
  for (const Help& h : kHelp)
    if (!std::strcmp(h.command, command)) return h.text;
  return nullptr;
}

}  // namespace kcp::app

// MpiComm: Comm over MPI on host memory (see comm_mpi.h). Every MPI call returns its error code on
// this communicator (MPI_ERRORS_RETURN), turned into kcp::Error naming the call.
#include "cp/comm_mpi.h"

#include <mpi.h>
#include <omp.h>

#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "core/error.h"
#include "cp/watchdog.h"

namespace kcp::cp {

std::vector<std::function<void()>>& abort_hooks();  // on_abort's list

namespace {

void mpi_check(int rc, const char* call) {
  if (rc == MPI_SUCCESS) return;
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  throw Error(detail::concat(call, " failed: ", std::string(msg, size_t(len))));
}

MPI_Datatype mpi_type(DType t) {
  switch (t) {
    case DType::f64: return MPI_DOUBLE;
    case DType::f32: return MPI_FLOAT;
    case DType::i32: return MPI_INT32_T;
    case DType::i64: return MPI_INT64_T;
    default: break;
  }
  throw Error(detail::concat("mpi comm: dtype ", dtype_name(t), " is not supported (float64, float32, int32, int64)"));
}

int mpi_count(int64_t count) {
  KCP_CHECK(count >= 0 && count <= INT_MAX, "mpi comm: element count ", count, " out of range [0, ", INT_MAX, "]");
  return int(count);
}

class MpiComm final : public Comm {
 public:
  explicit MpiComm(MPI_Comm c) : comm_(c) {
    mpi_check(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
    mpi_check(MPI_Comm_rank(comm_, &rank_), "MPI_Comm_rank");
    mpi_check(MPI_Comm_size(comm_, &size_), "MPI_Comm_size");
  }
  ~MpiComm() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Comm_free(&comm_);
  }
  std::string_view name() const override { return "mpi"; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }

  void all_gather(const void* send, void* recv, int64_t count, DType dtype) override {
    Watch w("MPI_Allgather");
    mpi_check(MPI_Allgather(send, mpi_count(count), mpi_type(dtype), recv, mpi_count(count), mpi_type(dtype), comm_),
              "MPI_Allgather");
  }
  void all_reduce(void* buf, int64_t count, DType dtype, ReduceOp op) override {
    Watch w("MPI_Allreduce");
    mpi_check(MPI_Allreduce(MPI_IN_PLACE, buf, mpi_count(count), mpi_type(dtype), op == ReduceOp::sum ? MPI_SUM : MPI_MAX,
                            comm_),
              "MPI_Allreduce");
  }
  void send(const void* buf, int64_t count, DType dtype, int dst, int tag) override {
    Watch w("MPI_Send");
    mpi_check(MPI_Send(buf, mpi_count(count), mpi_type(dtype), dst, tag, comm_), "MPI_Send");
  }
  void recv(void* buf, int64_t count, DType dtype, int src, int tag) override {
    Watch w("MPI_Recv");
    mpi_check(MPI_Recv(buf, mpi_count(count), mpi_type(dtype), src, tag, comm_, MPI_STATUS_IGNORE), "MPI_Recv");
  }
  void send_recv(const void* send, int dst, void* recv, int src, int64_t count, DType dtype, int tag) override {
    Watch w("MPI_Sendrecv");
    mpi_check(MPI_Sendrecv(send, mpi_count(count), mpi_type(dtype), dst == kNoRank ? MPI_PROC_NULL : dst, tag, recv,
                           mpi_count(count), mpi_type(dtype), src == kNoRank ? MPI_PROC_NULL : src, tag, comm_,
                           MPI_STATUS_IGNORE),
              "MPI_Sendrecv");
  }
  // Polls with short sleeps: ranks idling at a barrier on an oversubscribed host leave the cores
  // to the ranks that work (a blocking MPI_Barrier spins).
  void barrier() override {
    Watch w("MPI_Barrier");
    MPI_Request req;
    mpi_check(MPI_Ibarrier(comm_, &req), "MPI_Ibarrier");
    for (int done = 0;;) {
      mpi_check(MPI_Test(&req, &done, MPI_STATUS_IGNORE), "MPI_Test");
      if (done) return;
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  }
  [[noreturn]] void abort(int code, std::string_view message) override {
    std::fprintf(stderr, "%.*s\n", int(message.size()), message.data());
    for (const auto& hook : abort_hooks()) hook();
    std::fflush(stderr);
    std::fflush(stdout);
    MPI_Abort(MPI_COMM_WORLD, code);
    std::_Exit(code);  // MPI_Abort does not return; this keeps [[noreturn]] honest
  }
  std::unique_ptr<Comm> split(int color) override {
    MPI_Comm sub;
    mpi_check(MPI_Comm_split(comm_, color, rank_, &sub), "MPI_Comm_split");
    return std::make_unique<MpiComm>(sub);
  }

 private:
  MPI_Comm comm_;
  int rank_ = 0, size_ = 1;
};

}  // namespace

std::vector<std::function<void()>>& abort_hooks() {
  static std::vector<std::function<void()>> hooks;
  return hooks;
}

void on_abort(std::function<void()> hook) { abort_hooks().push_back(std::move(hook)); }

namespace {
// (rank, size) within this host's ranks of the job.
std::pair<int, int> host_position() {
  MPI_Comm local;
  int r = 0, n = 1;
  if (MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &local) == MPI_SUCCESS) {
    MPI_Comm_rank(local, &r);
    MPI_Comm_size(local, &n);
    MPI_Comm_free(&local);
  }
  return {r, n};
}
}  // namespace

// Computed once: MPI_Comm_split_type is collective over MPI_COMM_WORLD, so a later call made by some
// ranks only (cp-bench's subsets of ranks) must not enter it again; run_mpi_command primes it.
const std::pair<int, int>& cached_host_position() {
  static const std::pair<int, int> pos = host_position();
  return pos;
}
int local_rank() { return cached_host_position().first; }
int local_size() { return cached_host_position().second; }

MpiSession::MpiSession() {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (initialized) return;
  int provided = 0;
  mpi_check(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided), "MPI_Init_thread");
  owns_ = true;
}

MpiSession::~MpiSession() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (owns_ && !finalized) MPI_Finalize();
}

std::unique_ptr<Comm> make_mpi_comm() {
  MPI_Comm dup;
  mpi_check(MPI_Comm_dup(MPI_COMM_WORLD, &dup), "MPI_Comm_dup");
  return std::make_unique<MpiComm>(dup);
}

int run_mpi_command(const char* what, const std::function<int(Comm&)>& body) {
  MpiSession session;
  std::unique_ptr<Comm> world = make_mpi_comm();
  const char* omp = std::getenv("OMP_NUM_THREADS");
  const int ranks_here = local_size();  // collective on the first call: every rank makes it here
  if (!omp || !*omp) omp_set_num_threads(std::max(1, omp_get_num_procs() / ranks_here));
  int rc = 0;
  try {
    rc = body(*world);
  } catch (const std::exception& e) {
    world->abort(2, detail::concat(what, ": rank ", world->rank(), ": error: ", e.what()));
  }
  world.reset();
  return rc;
}

}  // namespace kcp::cp

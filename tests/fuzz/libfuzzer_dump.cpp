// libFuzzer target for the dump reader, in-process: bytes -> a file -> dump_read -> decode. Built by
// scripts/fuzz.sh --libfuzzer with clang (-fsanitize=fuzzer,address,undefined). kcp::Error is the
// expected answer to bad input; anything else (a crash, a sanitizer report, a leak, a timeout) is a
// finding. Crashes inside libhdf5 itself show up here too: the kcp programs contain those with a
// child process (app/isolate.h), the library API does not (io/dump.h says so).
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <string>

#include "core/error.h"
#include "io/dump_call.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string path = "/tmp/kcp_libfuzzer_" + std::to_string(getpid()) + ".h5";
  if (FILE* f = std::fopen(path.c_str(), "wb")) {
    std::fwrite(data, 1, size, f);
    std::fclose(f);
  }
  setenv("KCP_MAX_MEMORY", "512M", 0);
  try {
    const kcp::io::Dump d = kcp::io::dump_read(path);
    if (d.op == "conv1d") kcp::io::dump_conv1d_call(d);
    else kcp::io::dump_op_call(d, kcp::DType::f64);
  } catch (const kcp::Error&) {
  }
  return 0;
}

// Where the reader is: before each HDF5 call that parses the file (open, list a group, read an
// attribute or a dataset), the io layer notes the object, e.g. "x.h5: /inputs/q". A process that
// reads an untrusted file in a child (app/isolate.h) points this at memory shared with the parent,
// so that when the HDF5 library itself crashes or hangs on a corrupt file, the parent can say which
// object it was reading. Without a registered buffer, note_reading does nothing.
// Covered by tests/validation/test_isolate.cpp.
#pragma once

#include <cstddef>
#include <string>

namespace kcp::io {

// `reading` (when given) is set to 1 by note_reading and to 0 by note_done_reading: the parent
// applies its read time limit, and calls a crash "corrupt HDF5 file", only while it is 1.
void set_progress_buffer(char* buffer, size_t size, volatile int* reading = nullptr);  // nullptr: stop noting
void note_reading(const std::string& where);
void note_done_reading();  // dump_read returned
// While reading, cap the address space (RLIMIT_AS soft limit) at `bytes` above what the process
// already maps, so that libhdf5's own allocations for a corrupt file (a huge heap object or string)
// fail instead of filling the memory; the previous soft limit is restored when reading is done.
// 0: no cap (the default; under AddressSanitizer, which reserves terabytes, never set it).
void set_read_address_space(size_t bytes);

}  // namespace kcp::io

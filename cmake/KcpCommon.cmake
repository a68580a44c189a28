# Shared CMake helpers: warning flags per target, the CUDA language check, the configure summary.
include_guard(GLOBAL)

# The host instruction set. Eigen's products are 3-4x faster with AVX2+FMA than with the x86-64
# baseline (SSE2), and the chunkwise CPU algorithm is made of such products (docs/CHUNKWISE.md).
# "auto" picks x86-64-v3 only when this machine can run it, so tests never meet an illegal
# instruction; binaries carried to another machine need AVX2 there too (every x86 server since 2015).
set(KCP_MARCH "")
if(KCP_CPU_ARCH STREQUAL "auto")
  if(EXISTS /proc/cpuinfo)
    file(READ /proc/cpuinfo _kcp_cpuinfo)
    if(_kcp_cpuinfo MATCHES " avx2" AND _kcp_cpuinfo MATCHES " fma" AND _kcp_cpuinfo MATCHES " bmi2")
      set(KCP_MARCH "x86-64-v3")
    endif()
  endif()
elseif(NOT KCP_CPU_ARCH STREQUAL "none")
  set(KCP_MARCH "${KCP_CPU_ARCH}")
endif()

# Warnings go on targets, never into global flags.
function(kcp_target_defaults target)
  if(KCP_MARCH)
    target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-march=${KCP_MARCH}>)
  endif()
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic -Wshadow -Wconversion -Wno-sign-conversion>)
  if(KCP_WARNINGS_AS_ERRORS)
    target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-Werror>)
  endif()
  # Sources include each other as "core/tensor.h" from the project root; installed, the same headers
  # live under include/kcp/ (cmake/KcpInstall.cmake), so both spellings resolve there.
  target_include_directories(${target} PUBLIC $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}>)
endfunction()

# One line per feature for the configure summary (llm.c-style check marks).
function(kcp_summary name state detail)
  string(REPLACE ";" "," detail "${detail}")  # a ';' would split the stored entry (a CMake list)
  set_property(GLOBAL APPEND PROPERTY KCP_SUMMARY "${name}|${state}|${detail}")
endfunction()

function(kcp_print_summary)
  get_property(lines GLOBAL PROPERTY KCP_SUMMARY)
  message(STATUS "kcp configuration:")
  if(KCP_MARCH)
    message(STATUS "  [x] host code -march=${KCP_MARCH}  (KCP_CPU_ARCH=${KCP_CPU_ARCH})")
  else()
    message(STATUS "  [ ] host code at the x86-64 baseline  (KCP_CPU_ARCH=${KCP_CPU_ARCH}; no AVX2+FMA found)")
  endif()
  foreach(line IN LISTS lines)
    string(REPLACE "|" ";" parts "${line}")
    list(GET parts 0 name)
    list(GET parts 1 state)
    list(GET parts 2 detail)
    if(state)
      message(STATUS "  [x] ${name}  ${detail}")
    else()
      message(STATUS "  [ ] ${name}  ${detail}")
    endif()
  endforeach()
endfunction()

# CUDA must be enabled at the top level: the kcp executable links kcp_cuda, so the language is
# needed in the highest directory common to all users (CMake's enable_language rule).
set(KCP_HAS_CUDA OFF)
if(KCP_ENABLE_CUDA)
  if(NOT CMAKE_CUDA_COMPILER AND EXISTS /usr/local/cuda/bin/nvcc)
    set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
  endif()
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    # sm_90a: Hopper with its architecture-specific instructions (wgmma, setmaxnreg).
    set(CMAKE_CUDA_ARCHITECTURES ${KCP_CUDA_ARCH})
    enable_language(CUDA)
    set(CMAKE_CUDA_STANDARD 20)
    set(CMAKE_CUDA_STANDARD_REQUIRED ON)
    find_package(CUDAToolkit REQUIRED)
    set(KCP_HAS_CUDA ON)
  else()
    message(STATUS "kcp: nvcc not found; the CUDA backend is skipped")
  endif()
endif()

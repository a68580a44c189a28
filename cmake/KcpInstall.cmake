# Installing kcp as a library (docs/BUILD.md "Using kcp from another project"):
#   lib/libkcp_<name>.a, include/kcp/<folder>/*.h, bin/kcp, lib/cmake/kcp/kcpConfig.cmake with the
#   namespaced targets kcp::core, kcp::reference, kcp::cuda, kcp::io, kcp::cp (those built).
# Consumers: find_package(kcp REQUIRED) then target_link_libraries(app PRIVATE kcp::reference).
# Headers are written #include <kcp/core/backend.h>; the library's own "core/backend.h" spelling
# resolves too (include/kcp is on the interface include path). Covered by tests/install
# (ctest install_consumer: install, then build and run examples/ through find_package).
include_guard(GLOBAL)
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(KCP_INSTALL_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/kcp)

# kcp_export_library(<target> <name>): the alias kcp::<name> (the same spelling in and out of the
# build tree) and, with KCP_INSTALL, the library, its folder's public headers (*.h; the .cuh device
# headers stay private) and its entry in kcpTargets.cmake. Call from the library's own folder.
function(kcp_export_library target name)
  add_library(kcp::${name} ALIAS ${target})
  set_target_properties(${target} PROPERTIES EXPORT_NAME ${name})
  set_property(GLOBAL APPEND PROPERTY KCP_EXPORTED ${name})
  if(NOT KCP_INSTALL)
    return()
  endif()
  file(RELATIVE_PATH folder ${PROJECT_SOURCE_DIR} ${CMAKE_CURRENT_SOURCE_DIR})
  file(GLOB headers CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/*.h)
  install(FILES ${headers} DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/kcp/${folder})
  target_include_directories(${target} INTERFACE
    $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}> $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}/kcp>)
  install(TARGETS ${target} EXPORT kcpTargets
          ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
endfunction()

# The package files, after every folder: kcpConfig.cmake finds what the built libraries link
# (Eigen, OpenMP, HDF5, MPI, the CUDA runtime) before it loads the targets.
function(kcp_install_package)
  if(NOT KCP_INSTALL)
    return()
  endif()
  if(TARGET kcp)
    install(TARGETS kcp RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
  endif()
  get_property(KCP_COMPONENTS GLOBAL PROPERTY KCP_EXPORTED)
  set(KCP_NEEDS_CUDA_TOOLKIT OFF)
  if(TARGET kcp_cuda OR KCP_HAS_NCCL)
    set(KCP_NEEDS_CUDA_TOOLKIT ON)
  endif()
  install(EXPORT kcpTargets NAMESPACE kcp:: DESTINATION ${KCP_INSTALL_CMAKEDIR})
  configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/kcpConfig.cmake.in
    ${PROJECT_BINARY_DIR}/kcpConfig.cmake INSTALL_DESTINATION ${KCP_INSTALL_CMAKEDIR})
  write_basic_package_version_file(${PROJECT_BINARY_DIR}/kcpConfigVersion.cmake COMPATIBILITY SameMinorVersion)
  install(FILES ${PROJECT_BINARY_DIR}/kcpConfig.cmake ${PROJECT_BINARY_DIR}/kcpConfigVersion.cmake
          DESTINATION ${KCP_INSTALL_CMAKEDIR})
endfunction()

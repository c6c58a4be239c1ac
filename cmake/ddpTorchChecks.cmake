# What a libtorch from pytorch.org or pip needs from the machine, found and checked here so that a
# user meets a clear stop at configure time instead of a wrong build.
#
# Before find_package(Torch):
#   ddp_prefer_named_libtorch()   libtorch's config looks for its libraries and its Caffe2
#                                 config after the system's paths: with Debian's libtorch-dev
#                                 installed, a pip libtorch's headers would be used with Debian's
#                                 libtorch.so. Its own lib/ and Caffe2 config are put first.
#   ddp_define_missing_nvtoolsext()  CUDA 13 has no libnvToolsExt (NVTX 3 is header-only), and
#                                 the CUDA config of libtorch 2.6 still links CUDA::nvToolsExt.
# After it:
#   ddp_check_torch_libraries()   stops where libtorch.so is not the one of the named tree.
#   ddp_find_nccl_headers(OUT)    the nccl.h of the NCCL this libtorch was built with.
#   ddp_check_gloo_headers(DIR)   c10d's gloo header compiled against DIR's gloo.

function(ddp_prefer_named_libtorch)
  set(candidates ${Torch_DIR})
  foreach(prefix ${CMAKE_PREFIX_PATH})
    list(APPEND candidates ${prefix}/Torch ${prefix}/share/cmake/Torch)
  endforeach()
  foreach(dir ${candidates})
    if(EXISTS ${dir}/TorchConfig.cmake)
      get_filename_component(torch_root ${dir}/../../.. ABSOLUTE)
      if(EXISTS ${torch_root}/lib)
        list(PREPEND CMAKE_LIBRARY_PATH ${torch_root}/lib)
        set(CMAKE_LIBRARY_PATH ${CMAKE_LIBRARY_PATH} PARENT_SCOPE)
      endif()
      if(NOT Caffe2_DIR AND EXISTS ${dir}/../Caffe2/Caffe2Config.cmake)
        get_filename_component(caffe2_dir ${dir}/../Caffe2 ABSOLUTE)
        set(Caffe2_DIR ${caffe2_dir} PARENT_SCOPE)
      endif()
      return()
    endif()
  endforeach()
endfunction()

function(ddp_define_missing_nvtoolsext)
  find_package(CUDAToolkit QUIET)
  if(CUDAToolkit_FOUND AND NOT TARGET CUDA::nvToolsExt AND TARGET CUDA::nvtx3)
    add_library(CUDA::nvToolsExt INTERFACE IMPORTED GLOBAL)
    target_link_libraries(CUDA::nvToolsExt INTERFACE CUDA::nvtx3)
  endif()
endfunction()

function(ddp_check_torch_libraries)
  if(NOT TORCH_INSTALL_PREFIX)
    return()
  endif()
  get_filename_component(prefix ${TORCH_INSTALL_PREFIX} REALPATH)
  set(found ${TORCH_LIBRARY})
  if(TARGET torch_cpu)  # from the Caffe2 config, which is looked for separately
    get_target_property(torch_cpu_location torch_cpu LOCATION)
    list(APPEND found ${torch_cpu_location})
  endif()
  foreach(library ${found})
    get_filename_component(real ${library} REALPATH)
    string(FIND "${real}" "${prefix}/" at)
    if(NOT at EQUAL 0)
      message(FATAL_ERROR
        "libtorch's headers come from ${TORCH_INSTALL_PREFIX}, but its library was found at "
        "${library} (another libtorch on the system's paths). Start from an empty build "
        "folder, and name the tree with -DTorch_DIR=<tree>/share/cmake/Torch (or "
        "CMAKE_PREFIX_PATH=<tree>/share/cmake).")
    endif()
  endforeach()
endfunction()

# The NCCL version this libtorch was built with, as "MAJOR.MINOR.PATCH" (from libtorch itself:
# torch::cuda::nccl::version() returns the header version it was compiled against).
function(ddp_torch_nccl_version out)
  set(source ${CMAKE_BINARY_DIR}/ddp_torch_nccl_version.cpp)
  file(WRITE ${source} [=[
#include <cstdint>
#include <cstdio>
namespace torch::cuda::nccl { std::uint64_t version(); }
int main() {
  const std::uint64_t v = torch::cuda::nccl::version();
  std::printf("%u.%u.%u", unsigned(v >> 32), unsigned((v >> 16) & 0xffff), unsigned(v & 0xffff));
}
]=])
  # Linked to libtorch_cuda alone (its RPATH finds the rest): libtorch's imported targets carry
  # dependencies that a try_run project cannot import.
  find_library(torch_cuda_library torch_cuda HINTS ${TORCH_INSTALL_PREFIX}/lib NO_DEFAULT_PATH
               NO_CACHE)
  try_run(run_result compile_result ${CMAKE_BINARY_DIR}/ddp_torch_nccl_version ${source}
          LINK_LIBRARIES ${torch_cuda_library} -Wl,--allow-shlib-undefined
          COMPILE_OUTPUT_VARIABLE compile_output RUN_OUTPUT_VARIABLE run_output)
  if(NOT compile_result OR NOT run_result EQUAL 0)
    message(FATAL_ERROR "could not ask libtorch which NCCL it was built with "
                        "(torch::cuda::nccl::version()): ${compile_output}${run_output}")
  endif()
  set(${out} ${run_output} PARENT_SCOPE)
endfunction()

# c10d's ProcessGroupNCCL.hpp includes nccl.h, and ProcessGroupNCCL::Options embeds NCCL's config
# struct, whose size changes between NCCL releases: the header must be the one libtorch was built
# with. pip's torch depends on the nvidia-nccl wheel, which has it; the CUDA toolkit's may differ.
function(ddp_find_nccl_headers out)
  ddp_torch_nccl_version(torch_nccl)
  find_path(DDP_NCCL_INCLUDE_DIR nccl.h
            HINTS ${TORCH_INSTALL_PREFIX}/../nvidia/nccl/include ${CUDAToolkit_INCLUDE_DIRS}
            DOC "folder holding the nccl.h of the NCCL libtorch was built with")
  if(NOT DDP_NCCL_INCLUDE_DIR)
    message(FATAL_ERROR "NCCL's header (nccl.h) not found, and c10d's NCCL header needs it: this "
                        "libtorch was built with NCCL ${torch_nccl}. pip's torch brings it in the "
                        "nvidia-nccl wheel; else install that NCCL's headers and pass "
                        "-DDDP_NCCL_INCLUDE_DIR=<folder holding nccl.h>.")
  endif()
  file(STRINGS ${DDP_NCCL_INCLUDE_DIR}/nccl.h lines REGEX "^#define NCCL_(MAJOR|MINOR|PATCH) ")
  foreach(part MAJOR MINOR PATCH)
    string(REGEX MATCH "NCCL_${part} ([0-9]+)" _ "${lines}")
    set(header_${part} ${CMAKE_MATCH_1})
  endforeach()
  set(header "${header_MAJOR}.${header_MINOR}.${header_PATCH}")
  string(REGEX MATCH "^[0-9]+\\.[0-9]+" torch_major_minor "${torch_nccl}")
  if(NOT "${header_MAJOR}.${header_MINOR}" STREQUAL torch_major_minor)
    message(FATAL_ERROR
      "${DDP_NCCL_INCLUDE_DIR}/nccl.h is NCCL ${header}, but this libtorch was built with NCCL "
      "${torch_nccl}: c10d's NCCL options embed NCCL's config struct, whose layout differs between "
      "releases. Pass -DDDP_NCCL_INCLUDE_DIR=<folder with the nccl.h of NCCL ${torch_major_minor}> "
      "(pip: the nvidia-nccl wheel that torch depends on).")
  endif()
  message(STATUS "ddp-cpp: NCCL ${header} headers in ${DDP_NCCL_INCLUDE_DIR} (libtorch's: ${torch_nccl})")
  set(${out} ${DDP_NCCL_INCLUDE_DIR} PARENT_SCOPE)
  # libtorch_cuda finds its libnccl through its own RPATH at run time, but the linker resolves it
  # through the program's -rpath first, where the toolkit's NCCL (another release) may be found:
  # the folder beside the header (the wheel's lib/) is named to the linker first.
  get_filename_component(library_dir ${DDP_NCCL_INCLUDE_DIR}/../lib ABSOLUTE)
  if(EXISTS ${library_dir}/libnccl.so.2)
    set(${out}_LINK_DIR ${library_dir} PARENT_SCOPE)
  endif()
endfunction()

# gloo's version macro does not tell its releases apart, and gloo's classes changed layout between
# releases (gloo::Context lost its vtable in 2025): headers of another release than the gloo inside
# libtorch compile, and then read the wrong fields (ddp-cpp reaches gloo::Context's connections,
# gloo_peers.cpp). So a program with c10d's gloo header is compiled against the chosen folder,
# linked to libtorch's gloo, and run: it asks the library where a context's fields are and
# compares with where the headers put them. Done once per folder.
function(ddp_check_gloo_headers gloo_dir)
  if(DEFINED CACHE{DDP_GLOO_HEADERS_MATCH_LIBTORCH} AND DDP_GLOO_HEADERS_MATCH_LIBTORCH STREQUAL gloo_dir)
    return()
  endif()
  set(source ${CMAKE_BINARY_DIR}/ddp_gloo_headers_check.cpp)
  file(WRITE ${source} [=[
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <gloo/context.h>
#include <cstdio>
struct Probe : gloo::Context {  // the headers' offset of a protected field
  static constexpr auto timeout = &Probe::timeout_;
};
int main() {
  gloo::Context context(3, 5);  // built by the library's constructor
  context.setTimeout(std::chrono::milliseconds(4321));  // written by the library
  const bool same = context.rank == 3 && context.size == 5 &&
                    (context.*Probe::timeout).count() == 4321;
  std::printf(same ? "same" : "different");
  return same ? 0 : 1;
}
]=])
  # Compiled by hand, not through libtorch's imported targets, whose dependencies a try_run
  # project cannot import: its include folders, C++ standard and libraries are passed here.
  get_target_property(features torch INTERFACE_COMPILE_FEATURES)
  set(standard 17)
  if("cxx_std_20" IN_LIST features)
    set(standard 20)
  endif()
  find_library(torch_cpu_library torch_cpu HINTS ${TORCH_INSTALL_PREFIX}/lib NO_CACHE)
  find_library(c10_library c10 HINTS ${TORCH_INSTALL_PREFIX}/lib NO_CACHE)
  set(libraries ${torch_cpu_library} ${c10_library})
  # pip's and pytorch.org's trees carry gloo inside libtorch_cpu, in their own lib/; a distribution's
  # libtorch (elsewhere) links the system's libgloo.
  get_filename_component(torch_cpu_dir ${torch_cpu_library} DIRECTORY)
  if(NOT torch_cpu_dir STREQUAL "${TORCH_INSTALL_PREFIX}/lib")
    find_library(gloo_library gloo NO_CACHE)
    if(gloo_library)
      list(APPEND libraries ${gloo_library})
    endif()
  endif()
  message(STATUS "ddp-cpp: checking the gloo headers in ${gloo_dir}/gloo against libtorch's gloo")
  try_run(run_result compiled ${CMAKE_BINARY_DIR}/ddp_gloo_headers_check ${source}
          CMAKE_FLAGS "-DINCLUDE_DIRECTORIES=${TORCH_INCLUDE_DIRS};${gloo_dir}"
          COMPILE_DEFINITIONS -DUSE_C10D_GLOO ${TORCH_CXX_FLAGS}
          CXX_STANDARD ${standard}
          LINK_LIBRARIES ${libraries} -Wl,--allow-shlib-undefined
          COMPILE_OUTPUT_VARIABLE output RUN_OUTPUT_VARIABLE run_output)
  if(NOT compiled)
    string(REGEX MATCHALL "[^\n]*(error|undefined reference)[^\n]*" errors "${output}")
    list(LENGTH errors count)
    if(count GREATER 5)
      list(SUBLIST errors 0 5 errors)
    endif()
    string(REPLACE ";" "\n" errors "${errors}")
    message(FATAL_ERROR
      "c10d's gloo header (ProcessGroupGloo.hpp) of this libtorch does not build against the "
      "gloo headers in ${gloo_dir}/gloo:\n${errors}\nName a folder holding the gloo/ headers of "
      "the gloo this libtorch was built with: -DDDP_GLOO_INCLUDE_DIR=... (scripts/pip_env.sh "
      "fetches them for pip's torch).")
  endif()
  if(NOT run_result EQUAL 0)
    message(FATAL_ERROR
      "the gloo headers in ${gloo_dir}/gloo are of another gloo release than the one inside this "
      "libtorch: gloo::Context's fields are not where they say (${run_output}). Name a folder "
      "holding the gloo/ headers of the gloo this libtorch was built with: "
      "-DDDP_GLOO_INCLUDE_DIR=... (scripts/pip_env.sh fetches them for pip's torch).")
  endif()
  set(DDP_GLOO_HEADERS_MATCH_LIBTORCH ${gloo_dir} CACHE INTERNAL "gloo folder checked against libtorch")
endfunction()

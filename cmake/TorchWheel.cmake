# Finds the LibTorch inside a pip-installed torch wheel and prepares find_package(Torch) for it.
#
# The interpreter is DTR_PYTHON, else Python3_EXECUTABLE, else the first python3 on PATH (inside
# a venv that is the venv's). It asks that torch for its CMake prefix, version, C++11 ABI and CUDA
# version, then:
#   - CPU wheels: find_package(Torch) just works with the prefix.
#   - CUDA wheels: TorchConfig runs enable_language(CUDA) and FindCUDA. A `nvcc` on PATH that is a
#     wrapper script makes it guess the toolkit root wrong ("Could NOT find CUDA"), and it cannot
#     find the wheel's nvrtc (the link then fails on -lCUDA_nvrtc_LIBRARY-NOTFOUND). So we pass
#     the real toolkit root (CUDA_HOME / CUDA_PATH / /usr/local/cuda*) and the wheel's libnvrtc.
# Sets: DTR_TORCH_VERSION (e.g. 2.14.1+cu130), DTR_TORCH_CUDA (CUDA version or empty),
#       DTR_TORCH_LIB_DIR (torch/lib, for rpaths), DTR_TORCH_SITE (the site-packages holding it).
if(NOT DTR_PYTHON)
  if(Python3_EXECUTABLE)
    set(DTR_PYTHON "${Python3_EXECUTABLE}")
  else()
    find_program(DTR_PYTHON NAMES python3 python REQUIRED)
  endif()
endif()

execute_process(
  COMMAND "${DTR_PYTHON}" -c "import os, torch, torch.utils; print(torch.utils.cmake_prefix_path); print(torch.__version__); print(torch.version.cuda or ''); print(os.path.dirname(torch.__file__)); print(int(torch._C._GLIBCXX_USE_CXX11_ABI))"
  OUTPUT_VARIABLE _dtr_torch_info
  ERROR_VARIABLE _dtr_torch_err
  RESULT_VARIABLE _dtr_torch_rc
  OUTPUT_STRIP_TRAILING_WHITESPACE)
if(NOT _dtr_torch_rc EQUAL 0)
  message(FATAL_ERROR "dtr: ${DTR_PYTHON} cannot import torch (install torch==2.14.1 or 2.13.0 into it, or "
                      "pass -DDTR_PYTHON=<python with torch>, or -DDTR_BUILD_HOOKS=OFF):\n${_dtr_torch_err}")
endif()
string(REPLACE "\n" ";" _dtr_torch_info "${_dtr_torch_info}")
list(GET _dtr_torch_info 0 _dtr_torch_prefix)
list(GET _dtr_torch_info 1 DTR_TORCH_VERSION)
list(GET _dtr_torch_info 2 DTR_TORCH_CUDA)
list(GET _dtr_torch_info 3 _dtr_torch_dir)
list(GET _dtr_torch_info 4 DTR_TORCH_CXX11_ABI)
set(DTR_TORCH_LIB_DIR "${_dtr_torch_dir}/lib")
get_filename_component(DTR_TORCH_SITE "${_dtr_torch_dir}" DIRECTORY)
list(PREPEND CMAKE_PREFIX_PATH "${_dtr_torch_prefix}")
message(STATUS "dtr: torch ${DTR_TORCH_VERSION} from ${_dtr_torch_dir} (CUDA: ${DTR_TORCH_CUDA})")

if(DTR_TORCH_CUDA)
  if(NOT CUDA_TOOLKIT_ROOT_DIR)
    set(_dtr_cuda_roots "$ENV{CUDA_HOME}" "$ENV{CUDA_PATH}" /usr/local/cuda)
    file(GLOB _dtr_versioned_roots /usr/local/cuda-*)
    list(SORT _dtr_versioned_roots ORDER DESCENDING)
    list(APPEND _dtr_cuda_roots ${_dtr_versioned_roots})
    foreach(_root IN LISTS _dtr_cuda_roots)
      # The real toolkit: bin/nvcc next to include/cuda_runtime.h (a wrapper script has neither).
      if(_root AND EXISTS "${_root}/bin/nvcc" AND EXISTS "${_root}/include/cuda_runtime.h")
        set(CUDA_TOOLKIT_ROOT_DIR "${_root}" CACHE PATH "CUDA toolkit root")
        break()
      endif()
    endforeach()
  endif()
  if(NOT CUDA_TOOLKIT_ROOT_DIR)
    message(FATAL_ERROR "dtr: torch ${DTR_TORCH_VERSION} is a CUDA build; its CMake config needs the CUDA "
                        "toolkit (nvcc). Set CUDA_HOME to the toolkit root.")
  endif()
  set(CMAKE_CUDA_COMPILER "${CUDA_TOOLKIT_ROOT_DIR}/bin/nvcc" CACHE FILEPATH "nvcc")
  if(NOT CUDA_nvrtc_LIBRARY)
    file(GLOB _dtr_nvrtc "${DTR_TORCH_SITE}/nvidia/*/lib/libnvrtc.so*" "${DTR_TORCH_SITE}/nvidia/cuda_nvrtc/lib/libnvrtc.so*"
         "${CUDA_TOOLKIT_ROOT_DIR}/lib64/libnvrtc.so")
    list(FILTER _dtr_nvrtc EXCLUDE REGEX "builtins|alt")
    if(_dtr_nvrtc)
      list(GET _dtr_nvrtc 0 _dtr_nvrtc)
      set(CUDA_nvrtc_LIBRARY "${_dtr_nvrtc}" CACHE FILEPATH "nvrtc" FORCE)
    endif()
  endif()
  message(STATUS "dtr: CUDA toolkit ${CUDA_TOOLKIT_ROOT_DIR}, nvrtc ${CUDA_nvrtc_LIBRARY}")
endif()

find_package(Torch REQUIRED)

# FindNCCL: locate the NCCL headers and library.
#
# Hints: NCCL_ROOT (CMake or environment variable), then the CUDA toolkit's
# directories (CUDAToolkit_LIBRARY_ROOT / CUDA_HOME / /usr/local/cuda), whose
# libraries may sit in lib or lib64. Each directory is searched for the development
# link libnccl.so and then for the runtime's libnccl.so.2 alone, as the Python wheel
# (nvidia-nccl-cu*, site-packages/nvidia/nccl/{include,lib}) ships it: NCCL_ROOT set to
# that nccl folder finds it. NCCL_INCLUDE_DIR and NCCL_LIBRARY may also be given outright.
#
# Defines NCCL_FOUND, NCCL_INCLUDE_DIR, NCCL_LIBRARY, NCCL_VERSION and the imported
# target NCCL::NCCL.

set(_nccl_hints)
foreach(_root IN ITEMS "${NCCL_ROOT}" "$ENV{NCCL_ROOT}" "${CUDAToolkit_LIBRARY_ROOT}"
                       "$ENV{CUDA_HOME}" "$ENV{CUDA_PATH}" /usr/local/cuda)
    if(_root)
        list(APPEND _nccl_hints "${_root}")
    endif()
endforeach()
if(CUDAToolkit_INCLUDE_DIRS)
    list(APPEND _nccl_hints ${CUDAToolkit_INCLUDE_DIRS})
endif()

find_path(NCCL_INCLUDE_DIR nccl.h HINTS ${_nccl_hints} PATH_SUFFIXES include)
find_library(NCCL_LIBRARY NAMES nccl libnccl.so.2 NAMES_PER_DIR HINTS ${_nccl_hints}
             PATH_SUFFIXES lib lib64 lib/x64)

if(NCCL_INCLUDE_DIR AND EXISTS "${NCCL_INCLUDE_DIR}/nccl.h")
    file(STRINGS "${NCCL_INCLUDE_DIR}/nccl.h" _nccl_major REGEX "^#define NCCL_MAJOR[ \t]+[0-9]+")
    file(STRINGS "${NCCL_INCLUDE_DIR}/nccl.h" _nccl_minor REGEX "^#define NCCL_MINOR[ \t]+[0-9]+")
    file(STRINGS "${NCCL_INCLUDE_DIR}/nccl.h" _nccl_patch REGEX "^#define NCCL_PATCH[ \t]+[0-9]+")
    string(REGEX MATCH "[0-9]+$" _nccl_major "${_nccl_major}")
    string(REGEX MATCH "[0-9]+$" _nccl_minor "${_nccl_minor}")
    string(REGEX MATCH "[0-9]+$" _nccl_patch "${_nccl_patch}")
    if(_nccl_major)
        set(NCCL_VERSION "${_nccl_major}.${_nccl_minor}.${_nccl_patch}")
    endif()
endif()

include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(NCCL
    REQUIRED_VARS NCCL_LIBRARY NCCL_INCLUDE_DIR
    VERSION_VAR NCCL_VERSION)

if(NCCL_FOUND AND NOT TARGET NCCL::NCCL)
    add_library(NCCL::NCCL UNKNOWN IMPORTED)
    set_target_properties(NCCL::NCCL PROPERTIES
        IMPORTED_LOCATION "${NCCL_LIBRARY}"
        INTERFACE_INCLUDE_DIRECTORIES "${NCCL_INCLUDE_DIR}")
endif()
mark_as_advanced(NCCL_INCLUDE_DIR NCCL_LIBRARY)

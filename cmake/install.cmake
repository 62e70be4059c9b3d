# Installation: the CMake package (find_package(seldp CONFIG) -> seldp::seldp) and seldp.pc.
# The library target and the headers are installed by src/CMakeLists.txt (export set
# seldpTargets); this file adds what lets another project find and link them.
#
# libseldp.so links CUDA, NCCL and MPI privately: a consumer needs none of them to link it.
# The package finds them only for the components a consumer asks for
# (find_package(seldp COMPONENTS mpi cuda nccl) -> seldp::mpi, seldp::cuda, seldp::nccl), for
# code that includes seldp/mpi.h or passes CUDA memory itself.
include(CMakePackageConfigHelpers)

set(SELDP_INSTALL_CMAKEDIR "${CMAKE_INSTALL_LIBDIR}/cmake/seldp"
    CACHE STRING "Where the seldp CMake package is installed (relative to the prefix)")
mark_as_advanced(SELDP_INSTALL_CMAKEDIR)

# --- CMake package -------------------------------------------------------------
install(EXPORT seldpTargets
        NAMESPACE seldp::
        FILE seldpTargets.cmake
        DESTINATION "${SELDP_INSTALL_CMAKEDIR}")

# Hints that let find_dependency locate the toolkits this build used; a consumer's own
# CUDAToolkit_ROOT / NCCL_ROOT take precedence.
set(SELDP_CUDA_ROOT_HINT "")
if(SELDP_HAVE_CUDA AND CUDAToolkit_BIN_DIR)
    get_filename_component(SELDP_CUDA_ROOT_HINT "${CUDAToolkit_BIN_DIR}" DIRECTORY)
endif()
set(SELDP_NCCL_ROOT_HINT "")
if(SELDP_HAVE_NCCL AND NCCL_INCLUDE_DIR)
    get_filename_component(SELDP_NCCL_ROOT_HINT "${NCCL_INCLUDE_DIR}" DIRECTORY)
endif()

configure_package_config_file(
    "${PROJECT_SOURCE_DIR}/cmake/seldpConfig.cmake.in"
    "${PROJECT_BINARY_DIR}/cmake/seldpConfig.cmake"
    INSTALL_DESTINATION "${SELDP_INSTALL_CMAKEDIR}")
# The soname carries only the major version, so the package promises the same.
write_basic_package_version_file(
    "${PROJECT_BINARY_DIR}/cmake/seldpConfigVersion.cmake"
    VERSION ${PROJECT_VERSION}
    COMPATIBILITY SameMajorVersion)
set(_seldp_package_files "${PROJECT_BINARY_DIR}/cmake/seldpConfig.cmake"
                         "${PROJECT_BINARY_DIR}/cmake/seldpConfigVersion.cmake")
if(SELDP_HAVE_NCCL)
    # NCCL ships no CMake package: consumers find it with the same module this build used.
    list(APPEND _seldp_package_files "${PROJECT_SOURCE_DIR}/cmake/FindNCCL.cmake")
endif()
install(FILES ${_seldp_package_files} DESTINATION "${SELDP_INSTALL_CMAKEDIR}")

# --- pkg-config ------------------------------------------------------------------
# seldp.pc is written at install time, so that the prefix given then (cmake --install
# --prefix) is the one it names; DESTDIR is left out of it, as packagers expect.
function(_seldp_pc_path out dir)
    if(IS_ABSOLUTE "${dir}")
        set(${out} "${dir}" PARENT_SCOPE)
    else()
        set(${out} "\${prefix}/${dir}" PARENT_SCOPE)
    endif()
endfunction()
_seldp_pc_path(SELDP_PC_LIBDIR "${CMAKE_INSTALL_LIBDIR}")
_seldp_pc_path(SELDP_PC_INCLUDEDIR "${CMAKE_INSTALL_INCLUDEDIR}")

# What a static link (or a header that includes a dependency's header) needs.
set(_pc_libs "-pthread")
set(_pc_cflags)
if(SELDP_MATH_LIB)
    list(APPEND _pc_libs "-lm")
endif()
if(SELDP_HAVE_CUDA)
    list(APPEND _pc_libs "-L${CUDAToolkit_LIBRARY_DIR}" "-lcudart")
    foreach(_dir IN LISTS CUDAToolkit_INCLUDE_DIRS)
        list(APPEND _pc_cflags "-I${_dir}")
    endforeach()
endif()
if(SELDP_HAVE_NCCL)
    get_filename_component(_nccl_libdir "${NCCL_LIBRARY}" DIRECTORY)
    list(APPEND _pc_libs "-L${_nccl_libdir}" "-lnccl")
    list(APPEND _pc_cflags "-I${NCCL_INCLUDE_DIR}")
endif()
if(SELDP_HAVE_MPI)
    # Flags, not Requires.private on the MPI's own module (ompi-c, mpich): a consumer without
    # that .pc file (another MPI, or none) must still resolve seldp. The include directories
    # serve seldp/mpi.h; a directory that does not exist where the consumer builds is harmless.
    foreach(_dir IN LISTS MPI_C_INCLUDE_DIRS)
        list(APPEND _pc_cflags "-I${_dir}")
    endforeach()
    list(APPEND _pc_libs ${MPI_C_LIBRARIES})
endif()
list(REMOVE_DUPLICATES _pc_cflags)
list(REMOVE_DUPLICATES _pc_libs)
list(JOIN _pc_libs " " SELDP_PC_LIBS_PRIVATE)
list(JOIN _pc_cflags " " SELDP_PC_CFLAGS_EXTRA)
if(SELDP_PC_CFLAGS_EXTRA)
    string(PREPEND SELDP_PC_CFLAGS_EXTRA " ")
endif()

# libseldp.so is a shared library only: the private libraries matter to `pkg-config --static`
# alone, and Requires.private stays empty so that no other .pc file is needed.
# Everything but the prefix is known now; the prefix placeholder survives this first pass.
set(SELDP_PC_PREFIX "@SELDP_PC_PREFIX@")
configure_file("${PROJECT_SOURCE_DIR}/cmake/seldp.pc.in" "${PROJECT_BINARY_DIR}/pkgconfig/seldp.pc.in"
               @ONLY)
set(_pc_destination "${CMAKE_INSTALL_LIBDIR}/pkgconfig")
if(NOT IS_ABSOLUTE "${_pc_destination}")
    set(_pc_destination "\${CMAKE_INSTALL_PREFIX}/${_pc_destination}")
endif()
install(CODE "
    set(SELDP_PC_PREFIX \"\${CMAKE_INSTALL_PREFIX}\")
    string(MD5 _seldp_prefix_key \"\${CMAKE_INSTALL_PREFIX}\")
    set(_seldp_pc \"${PROJECT_BINARY_DIR}/pkgconfig/\${_seldp_prefix_key}/seldp.pc\")
    configure_file(\"${PROJECT_BINARY_DIR}/pkgconfig/seldp.pc.in\" \"\${_seldp_pc}\" @ONLY)
    file(INSTALL DESTINATION \"${_pc_destination}\" TYPE FILE FILES \"\${_seldp_pc}\")
")

# --- the example -------------------------------------------------------------------
# The example program's sources with its CMake project and Makefile, to build against this
# installation as they are (tests/install builds the installed copy).
install(FILES "${PROJECT_SOURCE_DIR}/harness/examples/train_two_groups.c"
              "${PROJECT_SOURCE_DIR}/harness/examples/shard_two_groups.c"
              "${PROJECT_SOURCE_DIR}/harness/examples/CMakeLists.txt"
              "${PROJECT_SOURCE_DIR}/harness/examples/Makefile"
        DESTINATION "${CMAKE_INSTALL_DOCDIR}/examples")

# Install seldp into a temporary prefix and use it from outside, as a researcher would:
#   1. cmake --install <build> --prefix <tmp>/prefix; check the files, the soname, the version;
#   2. configure the installed copy of harness/examples as its own project (find_package(seldp
#      CONFIG) through CMAKE_PREFIX_PATH) where CUDA, NCCL and MPI cannot be found, build it,
#      run both programs (the two-group training loop; the sharded optimizer of two groups,
#      bit-identical to the all-reduce path); ask for the package's components;
#   3. build it once more with its Makefile through pkg-config, with no other .pc file in
#      sight (no MPI module), run it; and once without a run path, run through
#      LD_LIBRARY_PATH.
# Run by ctest as: cmake -DSELDP_BUILD_DIR=.. -DSELDP_SOURCE_DIR=.. -DWORK_DIR=.. ... -P <this>
cmake_minimum_required(VERSION 3.25)
foreach(_var SELDP_BUILD_DIR SELDP_SOURCE_DIR WORK_DIR C_COMPILER EXPECTED_VERSION LIBDIR
             INCLUDEDIR SOVERSION DOCDIR)
    if(NOT DEFINED ${_var})
        message(FATAL_ERROR "install_consumer.cmake: -D${_var}=... is required")
    endif()
endforeach()

function(run_step what)
    execute_process(COMMAND ${ARGN} RESULT_VARIABLE _rc OUTPUT_VARIABLE _out
                    ERROR_VARIABLE _out)
    if(NOT _rc EQUAL 0)
        message(FATAL_ERROR "${what} failed (${_rc}):\n  ${ARGN}\n${_out}")
    endif()
    message(STATUS "${what}: ok")
    set(step_output "${_out}" PARENT_SCOPE)
endfunction()

function(expect_file path)
    if(NOT EXISTS "${path}")
        message(FATAL_ERROR "expected ${path} after installation, it is missing")
    endif()
endfunction()

set(prefix "${WORK_DIR}/prefix")
file(REMOVE_RECURSE "${WORK_DIR}")
file(MAKE_DIRECTORY "${WORK_DIR}")

# The consumer must be built the way the library was (a sanitized libseldp needs a sanitized
# program), and must compile cleanly against the installed headers.
set(consumer_flags "-Wall -Wextra -Wpedantic -Werror")
if(SANITIZE)
    string(APPEND consumer_flags " -fsanitize=${SANITIZE} -fno-omit-frame-pointer")
endif()

# --- 1. install --------------------------------------------------------------------
run_step("cmake --install" "${CMAKE_COMMAND}" --install "${SELDP_BUILD_DIR}" --prefix "${prefix}")
set(libdir "${prefix}/${LIBDIR}")
set(real_lib "${libdir}/libseldp.so.${EXPECTED_VERSION}")
expect_file("${prefix}/${INCLUDEDIR}/seldp/seldp.h")
expect_file("${real_lib}")
expect_file("${libdir}/libseldp.so.${SOVERSION}")
expect_file("${libdir}/libseldp.so")
expect_file("${libdir}/cmake/seldp/seldpConfig.cmake")
expect_file("${libdir}/cmake/seldp/seldpConfigVersion.cmake")
expect_file("${libdir}/cmake/seldp/seldpTargets.cmake")
expect_file("${libdir}/pkgconfig/seldp.pc")
set(examples "${prefix}/${DOCDIR}/examples")
foreach(_f train_two_groups.c shard_two_groups.c CMakeLists.txt Makefile)
    expect_file("${examples}/${_f}")
endforeach()
# The library's optional dependencies are private: the exported target names none of them.
file(READ "${libdir}/cmake/seldp/seldpTargets.cmake" _targets)
if(_targets MATCHES "(CUDA|NCCL|MPI)::")
    message(FATAL_ERROR "seldpTargets.cmake names ${CMAKE_MATCH_0} targets: a consumer would "
                        "need that dependency to configure")
endif()
file(GLOB _src_headers RELATIVE "${SELDP_SOURCE_DIR}/include/seldp"
     "${SELDP_SOURCE_DIR}/include/seldp/*.h")
foreach(_h IN LISTS _src_headers)
    expect_file("${prefix}/${INCLUDEDIR}/seldp/${_h}")
endforeach()

find_program(READELF readelf)
if(READELF)
    run_step("readelf" "${READELF}" -d "${real_lib}")
    if(NOT step_output MATCHES "Library soname: \\[libseldp\\.so\\.${SOVERSION}\\]")
        message(FATAL_ERROR "libseldp's soname is not libseldp.so.${SOVERSION}:\n${step_output}")
    endif()
endif()

# --- 2. find_package(seldp CONFIG) -------------------------------------------------------
set(cmake_build "${WORK_DIR}/cmake-build")
# CUDA, NCCL and MPI out of reach: the package must not need them.
set(no_optional_deps -DCMAKE_DISABLE_FIND_PACKAGE_CUDAToolkit=ON
    -DCMAKE_DISABLE_FIND_PACKAGE_NCCL=ON -DCMAKE_DISABLE_FIND_PACKAGE_MPI=ON)
set(configure_args -S "${examples}" -B "${cmake_build}"
    "-DCMAKE_PREFIX_PATH=${prefix}" "-DCMAKE_C_COMPILER=${C_COMPILER}"
    "-DCMAKE_C_FLAGS=${consumer_flags}" "-DCMAKE_BUILD_TYPE=Debug" ${no_optional_deps})
if(GENERATOR)
    list(APPEND configure_args -G "${GENERATOR}")
endif()
run_step("configure the example with find_package(seldp)" "${CMAKE_COMMAND}" ${configure_args})
# It must have found this prefix, not another seldp installed on the machine.
if(NOT step_output MATCHES "seldp ${EXPECTED_VERSION} from ([^\n]*)")
    message(FATAL_ERROR "the example did not report the seldp it found:\n${step_output}")
endif()
file(REAL_PATH "${CMAKE_MATCH_1}" _found)
file(REAL_PATH "${libdir}/cmake/seldp" _expected)
if(NOT _found STREQUAL _expected)
    message(FATAL_ERROR "find_package(seldp) found ${_found}, expected ${_expected}")
endif()
run_step("build the example (CMake)" "${CMAKE_COMMAND}" --build "${cmake_build}")
run_step("run the example (CMake build)" "${cmake_build}/train_two_groups")
message("${step_output}")
if(NOT step_output MATCHES "seldp ${EXPECTED_VERSION} \\(transports: host")
    message(FATAL_ERROR "the example did not report seldp ${EXPECTED_VERSION}:\n${step_output}")
endif()
# The sharded optimizer of two groups (AdamW on each rank's ranges), built against the
# installed headers alone: its parameters must stay bit-identical to the all-reduce path's.
run_step("run the sharded example (CMake build)" "${cmake_build}/shard_two_groups")
message("${step_output}")
if(NOT step_output MATCHES "ok: loss .* bit-identical to the all-reduce path")
    message(FATAL_ERROR "the sharded example did not finish:\n${step_output}")
endif()

# Components: mpi gives seldp::mpi when the library has MPI (and is not found without it);
# an unknown component is an error.
set(comp_src "${WORK_DIR}/components")
file(WRITE "${comp_src}/CMakeLists.txt" "
cmake_minimum_required(VERSION 3.25)
project(seldp_components LANGUAGES C)
find_package(seldp CONFIG REQUIRED COMPONENTS \${WANT})
if(NOT TARGET seldp::\${WANT})
    message(FATAL_ERROR \"no seldp::\${WANT}\")
endif()
")
function(configure_components want expect_ok)
    execute_process(COMMAND "${CMAKE_COMMAND}" -S "${comp_src}" -B "${WORK_DIR}/components-${want}"
                            "-DCMAKE_PREFIX_PATH=${prefix}" "-DCMAKE_C_COMPILER=${C_COMPILER}"
                            "-DWANT=${want}" ${ARGN}
                    RESULT_VARIABLE _rc OUTPUT_VARIABLE _out ERROR_VARIABLE _out)
    if(expect_ok AND NOT _rc EQUAL 0)
        message(FATAL_ERROR "find_package(seldp COMPONENTS ${want}) failed:\n${_out}")
    elseif(NOT expect_ok AND _rc EQUAL 0)
        message(FATAL_ERROR "find_package(seldp COMPONENTS ${want}) succeeded, expected a failure")
    endif()
    message(STATUS "find_package(seldp COMPONENTS ${want}) ${ARGN}: as expected")
endfunction()
configure_components(bogus FALSE)
if(HAVE_MPI)
    configure_components(mpi TRUE)
    configure_components(mpi FALSE -DCMAKE_DISABLE_FIND_PACKAGE_MPI=ON)
else()
    configure_components(mpi FALSE)
endif()

# --- 3. pkg-config -------------------------------------------------------------------
find_program(PKG_CONFIG_EXECUTABLE NAMES pkg-config pkgconf)
find_program(MAKE_EXECUTABLE NAMES make gmake)
if(NOT PKG_CONFIG_EXECUTABLE OR NOT MAKE_EXECUTABLE)
    message(FATAL_ERROR "pkg-config and make are needed for the pkg-config half of this test")
endif()
# Only seldp.pc in sight: it must not require another module (the MPI's, say).
set(ENV{PKG_CONFIG_LIBDIR} "${libdir}/pkgconfig")
unset(ENV{PKG_CONFIG_PATH})
run_step("pkg-config --modversion seldp" "${PKG_CONFIG_EXECUTABLE}" --modversion seldp)
string(STRIP "${step_output}" _pc_version)
if(NOT _pc_version STREQUAL EXPECTED_VERSION)
    message(FATAL_ERROR "seldp.pc says version '${_pc_version}', expected ${EXPECTED_VERSION}")
endif()
run_step("pkg-config --cflags --libs seldp" "${PKG_CONFIG_EXECUTABLE}" --cflags --libs seldp)
message(STATUS "  ${step_output}")
string(FIND "${step_output}" "-I${prefix}/${INCLUDEDIR}" _at_include)
string(FIND "${step_output}" "-L${libdir}" _at_lib)
if(_at_include LESS 0 OR _at_lib LESS 0)
    message(FATAL_ERROR "seldp.pc does not point into ${prefix} (installed with --prefix): "
                        "${step_output}")
endif()
set(make_build "${WORK_DIR}/make-build")
file(MAKE_DIRECTORY "${make_build}")
run_step("pkg-config --static --libs seldp" "${PKG_CONFIG_EXECUTABLE}" --static --libs seldp)
run_step("build the example (Makefile, pkg-config)" "${MAKE_EXECUTABLE}"
         -C "${examples}" "BUILD_DIR=${make_build}"
         "CC=${C_COMPILER}" "CFLAGS=-O1 -g ${consumer_flags}")
run_step("run the example (pkg-config build)" "${make_build}/train_two_groups")
if(NOT step_output MATCHES "ok: loss")
    message(FATAL_ERROR "the pkg-config build of the example did not finish:\n${step_output}")
endif()
run_step("run the sharded example (pkg-config build)" "${make_build}/shard_two_groups")
if(NOT step_output MATCHES "ok: loss .* bit-identical to the all-reduce path")
    message(FATAL_ERROR "the pkg-config build of the sharded example did not finish:\n${step_output}")
endif()
# Without a run path the program finds libseldp through LD_LIBRARY_PATH, as the README says.
execute_process(COMMAND "${PKG_CONFIG_EXECUTABLE}" --cflags --libs seldp
                OUTPUT_VARIABLE _pc_flags OUTPUT_STRIP_TRAILING_WHITESPACE)
separate_arguments(_pc_flags UNIX_COMMAND "${_pc_flags}")
separate_arguments(_cc_flags UNIX_COMMAND "${consumer_flags}")
run_step("build the example without a run path" "${C_COMPILER}" -std=c11 ${_cc_flags}
         -pthread -o "${make_build}/train_two_groups_norpath" "${examples}/train_two_groups.c"
         ${_pc_flags} -pthread)
run_step("run it with LD_LIBRARY_PATH" "${CMAKE_COMMAND}" -E env "LD_LIBRARY_PATH=${libdir}"
         "${make_build}/train_two_groups_norpath")
if(NOT step_output MATCHES "ok: loss")
    message(FATAL_ERROR "the example without a run path did not finish:\n${step_output}")
endif()
file(REMOVE_RECURSE "${WORK_DIR}")

# The sealed library boundary: libseldp.so exports exactly the public API.
#   - every dynamic symbol it defines is a public seldp_ name (no seldp__ internals, no
#     helper of a dependency);
#   - every function a public header declares carries SELDP_API and is exported (the
#     transports' entry points only when that transport is compiled in).
# Run by ctest as: cmake -DLIBRARY=.. -DHEADER_DIR=.. -DNM=.. [-DHAVE_MPI=ON ...] -P <this>
cmake_minimum_required(VERSION 3.25)
foreach(_var LIBRARY HEADER_DIR NM)
    if(NOT DEFINED ${_var})
        message(FATAL_ERROR "check_exports.cmake: -D${_var}=... is required")
    endif()
endforeach()

execute_process(COMMAND "${NM}" -D --defined-only "${LIBRARY}" RESULT_VARIABLE _rc
                OUTPUT_VARIABLE _nm ERROR_VARIABLE _err)
if(NOT _rc EQUAL 0)
    message(FATAL_ERROR "${NM} -D --defined-only ${LIBRARY} failed (${_rc}): ${_err}")
endif()
set(exported)
string(REPLACE "\n" ";" _lines "${_nm}")
foreach(_line IN LISTS _lines)
    if(_line MATCHES "^[0-9a-fA-F]* *[A-Za-z] ([^ @]+)")
        list(APPEND exported "${CMAKE_MATCH_1}")
    endif()
endforeach()
if(NOT exported)
    message(FATAL_ERROR "${LIBRARY} exports no symbol at all:\n${_nm}")
endif()

# Declarations: a line of a public header that starts with an optional SELDP_API, a return
# type and a seldp_ name followed by "(".
set(declared)
set(problems)
file(GLOB _headers "${HEADER_DIR}/*.h")
foreach(_file IN LISTS _headers)
    get_filename_component(_name "${_file}" NAME)
    file(STRINGS "${_file}" _decls REGEX "^(SELDP_API )?(const )?[a-z_0-9]+[ *]+seldp_[a-z0-9_]+\\(")
    foreach(_decl IN LISTS _decls)
        string(REGEX REPLACE "^.*[ *](seldp_[a-z0-9_]+)\\(.*$" "\\1" _fn "${_decl}")
        if(NOT _decl MATCHES "^SELDP_API ")
            list(APPEND problems "${_name}: ${_fn} is declared without SELDP_API "
                                 "(sh cmake/apply-export-macro.sh marks it)")
        endif()
        if(((_name STREQUAL "mpi.h" OR _name STREQUAL "hybrid.h") AND NOT HAVE_MPI) OR (_name STREQUAL "nccl.h" AND NOT HAVE_NCCL))
            list(APPEND declared "${_fn}")
            continue()
        endif()
        list(APPEND declared "${_fn}")
        if(NOT _fn IN_LIST exported)
            list(APPEND problems "${_name}: ${_fn} is declared but libseldp.so does not export it")
        endif()
    endforeach()
endforeach()

foreach(_sym IN LISTS exported)
    if(_sym MATCHES "^seldp__")
        list(APPEND problems "libseldp.so exports the internal ${_sym}")
    elseif(NOT _sym MATCHES "^seldp_")
        list(APPEND problems "libseldp.so exports ${_sym}, which is not a seldp_ name")
    elseif(NOT _sym IN_LIST declared)
        list(APPEND problems "libseldp.so exports ${_sym}, which no public header declares")
    endif()
endforeach()

if(problems)
    list(JOIN problems "\n  " _text)
    message(FATAL_ERROR "the library boundary leaks or lacks symbols:\n  ${_text}")
endif()
list(LENGTH exported _n)
message(STATUS "libseldp.so exports ${_n} symbols, every one a declared public seldp_ function")

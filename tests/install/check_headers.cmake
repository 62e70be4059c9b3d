# Static checks of the public headers (include/seldp/*.h), which are installed as they are:
#   - a header that declares anything wraps it in extern "C" guards for C++ callers;
#   - it includes only other public headers, the C standard headers it needs, or a
#     transport's own headers (mpi.h, nccl.h, CUDA runtime);
#   - it names nothing internal: no seldp__ names, and a struct that src/ defines appears
#     here only as an opaque typedef, never with its members.
# That the headers compile alone, without src/ on the include path, is checked by building
# tests/install's header objects.
cmake_minimum_required(VERSION 3.25)
foreach(_var HEADER_DIR SOURCE_DIR)
    if(NOT DEFINED ${_var})
        message(FATAL_ERROR "check_headers.cmake: -D${_var}=... is required")
    endif()
endforeach()

set(allowed_system_headers stdbool.h stddef.h stdint.h mpi.h nccl.h cuda_runtime.h
                           cuda_runtime_api.h)

# Strip /* */ and // comments so that words in documentation do not count.
function(strip_comments out text)
    string(REGEX REPLACE "/\\*([^*]|\\*+[^*/])*\\*+/" "" text "${text}")
    string(REGEX REPLACE "//[^\n]*" "" text "${text}")
    set(${out} "${text}" PARENT_SCOPE)
endfunction()

# Struct tags that the library defines internally (with members).
set(internal_structs)
file(GLOB_RECURSE _internal_headers "${SOURCE_DIR}/*.h")
foreach(_file IN LISTS _internal_headers)
    file(READ "${_file}" _text)
    strip_comments(_text "${_text}")
    string(REGEX MATCHALL "struct[ \t\n]+seldp_[A-Za-z0-9_]*[ \t\n]*{" _defs "${_text}")
    foreach(_def IN LISTS _defs)
        string(REGEX REPLACE "struct[ \t\n]+([A-Za-z0-9_]+).*" "\\1" _tag "${_def}")
        list(APPEND internal_structs "${_tag}")
    endforeach()
endforeach()

set(problems)
file(GLOB _headers "${HEADER_DIR}/*.h")
if(NOT _headers)
    message(FATAL_ERROR "no public headers under ${HEADER_DIR}")
endif()
foreach(_file IN LISTS _headers)
    get_filename_component(_name "${_file}" NAME)
    file(READ "${_file}" _raw)
    strip_comments(_text "${_raw}")

    # What remains once preprocessor lines are gone is what needs C linkage.
    string(REGEX REPLACE "(^|\n)[ \t]*#[^\n]*" "\\1" _decls "${_text}")
    string(STRIP "${_decls}" _decls)
    if(_decls)
        if(NOT _text MATCHES "#ifdef __cplusplus[ \t]*\nextern \"C\" {[ \t]*\n#endif"
           OR NOT _text MATCHES "#ifdef __cplusplus[ \t]*\n}[ \t]*\n#endif")
            list(APPEND problems "${_name}: declarations without extern \"C\" guards")
        endif()
    endif()

    string(REGEX MATCHALL "#[ \t]*include[ \t]*[<\"][^>\"]+[>\"]" _includes "${_text}")
    foreach(_inc IN LISTS _includes)
        string(REGEX REPLACE "#[ \t]*include[ \t]*[<\"]([^>\"]+)[>\"]" "\\1" _path "${_inc}")
        if(_path MATCHES "^seldp/[A-Za-z0-9_]+\\.h$")
            if(NOT EXISTS "${HEADER_DIR}/../${_path}")
                list(APPEND problems "${_name}: includes ${_path}, which is not a public header")
            endif()
        elseif(NOT _path IN_LIST allowed_system_headers)
            list(APPEND problems "${_name}: includes ${_path}, which is not installed with seldp")
        endif()
    endforeach()

    if(_text MATCHES "seldp__[A-Za-z0-9_]*")
        list(APPEND problems "${_name}: names the internal ${CMAKE_MATCH_0}")
    endif()
    foreach(_tag IN LISTS internal_structs)
        if(_text MATCHES "struct[ \t\n]+${_tag}[ \t\n]*{")
            list(APPEND problems "${_name}: defines the members of the internal struct ${_tag}")
        endif()
    endforeach()
endforeach()

list(LENGTH _headers _count)
if(problems)
    list(JOIN problems "\n  " _report)
    message(FATAL_ERROR "public headers:\n  ${_report}")
endif()
message(STATUS "${_count} public headers: extern \"C\" guards, public includes only, "
               "no internal names")

# seldp-harness under mpirun with --ranks-per-process against the same run on threads: both
# pass and their dumps are equal, byte for byte (the hybrid transport sums in the threads'
# order, docs/library.md).
#   cmake -DMPIEXEC=<mpirun> -DMPIFLAGS="--oversubscribe;..." -DHARNESS=<seldp-harness>
#         -DNP=<processes> -DPER=<ranks per process> -DARGS="--world;8;..." -DWORK=<dir>
#         -P hybrid_harness.cmake
file(REMOVE_RECURSE "${WORK}")
file(MAKE_DIRECTORY "${WORK}")
set(common ${ARGS} --steps 2 --quiet --timeout 60)
execute_process(COMMAND ${MPIEXEC} -np ${NP} ${MPIFLAGS} ${HARNESS} --ranks-per-process ${PER}
                        ${common} --out ${WORK}/out-hybrid --dump ${WORK}/hybrid
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0 OR NOT out MATCHES "result: PASS")
    message(FATAL_ERROR "the hybrid run (${NP} x ${PER}) failed (${rc}):\n${out}\n${err}")
endif()
execute_process(COMMAND ${HARNESS} ${common} --out ${WORK}/out-threads --dump ${WORK}/threads
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
    message(FATAL_ERROR "the threaded run failed (${rc}):\n${out}\n${err}")
endif()
file(GLOB files RELATIVE "${WORK}/threads" "${WORK}/threads/*")
list(LENGTH files n)
if(n LESS 2)
    message(FATAL_ERROR "the threaded dump has ${n} files")
endif()
foreach(f IN LISTS files)
    if(NOT EXISTS "${WORK}/hybrid/${f}")
        message(FATAL_ERROR "the hybrid dump has no ${f}")
    endif()
    file(SHA256 "${WORK}/threads/${f}" a)
    file(SHA256 "${WORK}/hybrid/${f}" b)
    if(NOT a STREQUAL b)
        message(FATAL_ERROR "${f} differs between the hybrid and the threaded dumps")
    endif()
endforeach()
message(STATUS "${n} files equal")

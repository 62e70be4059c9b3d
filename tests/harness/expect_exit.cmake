# Run a command and check its exit status and stderr (ctest cannot check both at once).
#   cmake -DCMD="prog;arg;..." -DSTATUS=2 -DSTDERR=<regex> -P expect_exit.cmake
execute_process(COMMAND ${CMD} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc STREQUAL "${STATUS}")
    message(FATAL_ERROR "exit status ${rc}, expected ${STATUS}\nstderr: ${err}")
endif()
if(NOT err MATCHES "${STDERR}")
    message(FATAL_ERROR "stderr does not match '${STDERR}':\n${err}")
endif()

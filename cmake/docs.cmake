# docs: the API reference, Doxygen over the public headers (include/seldp) and docs/mainpage.md.
# Any Doxygen warning fails the target, so every public declaration must be documented.
# Without Doxygen (apt-get install doxygen) there is no docs target and the build goes on.
find_package(Doxygen QUIET)
if(NOT DOXYGEN_FOUND)
    message(STATUS "Doxygen not found: no 'docs' target")
    return()
endif()

set(SELDP_DOCS_OUTPUT_DIR "${PROJECT_BINARY_DIR}/docs")
set(SELDP_DOCS_INPUT "${PROJECT_SOURCE_DIR}/include/seldp ${PROJECT_SOURCE_DIR}/docs/mainpage.md")
set(SELDP_DOXYFILE "${SELDP_DOCS_OUTPUT_DIR}/Doxyfile")
configure_file("${PROJECT_SOURCE_DIR}/docs/Doxyfile.in" "${SELDP_DOXYFILE}" @ONLY)

add_custom_target(docs
    COMMAND Doxygen::doxygen "${SELDP_DOXYFILE}"
    WORKING_DIRECTORY "${SELDP_DOCS_OUTPUT_DIR}"
    COMMENT "API reference: ${SELDP_DOCS_OUTPUT_DIR}/html/index.html"
    VERBATIM)

# Installed on request only: cmake --build . --target docs, then
# cmake --install . --component docs.
install(DIRECTORY "${SELDP_DOCS_OUTPUT_DIR}/html/" DESTINATION "${CMAKE_INSTALL_DOCDIR}/html"
        COMPONENT docs EXCLUDE_FROM_ALL OPTIONAL)

# The reference must keep building without warnings as the headers grow.
if(SELDP_BUILD_TESTS)
    add_test(NAME api_docs COMMAND "${DOXYGEN_EXECUTABLE}" "${SELDP_DOXYFILE}"
             WORKING_DIRECTORY "${SELDP_DOCS_OUTPUT_DIR}")
    set_tests_properties(api_docs PROPERTIES LABELS install TIMEOUT 120)
endif()

# The documentation's checks (included by tests/CMakeLists.txt), label docs:
#   docs.links          every relative link and #anchor of README.md and docs/*.md resolves
#   docs.excerpts       every block marked `<!-- excerpt: PATH -->` is a verbatim slice of PATH
#   docs.python         every ```python block runs (/usr/bin/python3, this build's module)
#   docs.sh             every ```sh block runs with this build's `attn` first on PATH
#   docs.cpp.N          every ```cpp block, extracted at configure time into build/tests/doc_examples
#                       (a page's edit re-runs the extraction), compiled against attn and run
#   docs.perf_tables.M  scripts/perf_tables.py reproduces machine M's tables in docs/performance.md
#                       (and the summary in README.md) from the `attn bench --json` run kept in
#                       docs/performance-M.json
#   docs.undocumented   Doxygen over include/attn/*.hpp: no public function without a doc comment
#   docs.python_docstrings  every public name of the Python package, and its classes' members, has a docstring
# The `docs` target builds the API reference: Doxygen's HTML (build/docs/cpp/html) and pydoc's pages
# of attn, attn.torch and attn.flash (build/docs/python).
# tests/docs_check.py and tests/docs_api.py say what each check does.
if(NOT EXISTS /usr/bin/python3 OR ATTN_SANITIZE OR ATTN_TSAN)
  return()
endif()
set(attn_doc_python /usr/bin/python3)
file(GLOB attn_doc_pages CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/docs/*.md)
set(attn_doc_pages ${PROJECT_SOURCE_DIR}/README.md ${attn_doc_pages})
set(attn_doc_check ${CMAKE_CURRENT_LIST_DIR}/docs_check.py)

add_test(NAME docs.links COMMAND ${attn_doc_python} ${attn_doc_check} links ${attn_doc_pages})
add_test(NAME docs.excerpts COMMAND ${attn_doc_python} ${attn_doc_check} excerpts ${attn_doc_pages})
add_test(NAME docs.sh COMMAND ${attn_doc_python} ${attn_doc_check} sh --bin $<TARGET_FILE_DIR:attn_cli> ${attn_doc_pages})
set_tests_properties(docs.links docs.excerpts docs.sh PROPERTIES LABELS docs TIMEOUT 300)
if(TARGET attn_python)
  add_test(NAME docs.python
           COMMAND ${attn_doc_python} ${attn_doc_check} python --pythonpath ${PROJECT_BINARY_DIR}/python ${attn_doc_pages})
  add_test(NAME docs.python_docstrings COMMAND ${attn_doc_python} ${CMAKE_CURRENT_LIST_DIR}/docs_api.py python)
  set_tests_properties(docs.python docs.python_docstrings PROPERTIES LABELS docs TIMEOUT 300
                       ENVIRONMENT "PYTHONPATH=${PROJECT_BINARY_DIR}/python;PYTHONDONTWRITEBYTECODE=1")
endif()

# The C++ blocks: one program each, built with the tests.
set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS ${attn_doc_pages} ${attn_doc_check})
execute_process(COMMAND ${attn_doc_python} ${attn_doc_check} cpp-extract --out ${CMAKE_CURRENT_BINARY_DIR}/doc_examples
                        ${attn_doc_pages}
                OUTPUT_VARIABLE attn_doc_cpp RESULT_VARIABLE attn_doc_cpp_rc OUTPUT_STRIP_TRAILING_WHITESPACE)
if(NOT attn_doc_cpp_rc EQUAL 0)
  message(FATAL_ERROR "tests/docs_check.py cpp-extract failed: ${attn_doc_cpp}")
endif()
string(REPLACE "\n" ";" attn_doc_cpp "${attn_doc_cpp}")
foreach(entry ${attn_doc_cpp})
  string(REGEX MATCH "^[0-9]+" index "${entry}")
  add_executable(doc_example_${index} ${CMAKE_CURRENT_BINARY_DIR}/doc_examples/doc_${index}.cpp)
  target_link_libraries(doc_example_${index} PRIVATE attn)
  foreach(part attn_io attn_train)  # the library's other parts, where it is split
    if(TARGET ${part})
      target_link_libraries(doc_example_${index} PRIVATE ${part})
    endif()
  endforeach()
  add_test(NAME docs.cpp.${index} COMMAND doc_example_${index})
  set_tests_properties(docs.cpp.${index} PROPERTIES LABELS docs TIMEOUT 120)
endforeach()

# docs/performance.md's tables, regenerated from the JSON they were made from.
# One test a machine; README.md holds the Zen 5's summary.
add_test(NAME docs.perf_tables.zen5
         COMMAND ${attn_doc_python} ${PROJECT_SOURCE_DIR}/scripts/perf_tables.py --check
                 ${PROJECT_SOURCE_DIR}/docs/performance-zen5.json ${PROJECT_SOURCE_DIR}/docs/performance.md
                 ${PROJECT_SOURCE_DIR}/README.md)
add_test(NAME docs.perf_tables.xeon
         COMMAND ${attn_doc_python} ${PROJECT_SOURCE_DIR}/scripts/perf_tables.py --check
                 ${PROJECT_SOURCE_DIR}/docs/performance-xeon.json ${PROJECT_SOURCE_DIR}/docs/performance.md)
set_tests_properties(docs.perf_tables.zen5 docs.perf_tables.xeon PROPERTIES LABELS docs TIMEOUT 60)

# The API reference and its completeness check.
find_program(ATTN_DOXYGEN doxygen)
if(ATTN_DOXYGEN)
  set(ATTN_DOXYGEN_OUT ${PROJECT_BINARY_DIR}/docs/cpp)
  file(MAKE_DIRECTORY ${ATTN_DOXYGEN_OUT})
  file(WRITE ${ATTN_DOXYGEN_OUT}/namespaces.dox
       "/// @namespace attn\n/// attn's public API (include/attn): tensor views, masks, softmax, bmm, attention, Nadaraya-Watson, training.\n"
       "/// @namespace attn::io\n/// .npy files, heatmaps and plots.\n")
  configure_file(${PROJECT_SOURCE_DIR}/docs/Doxyfile.in ${ATTN_DOXYGEN_OUT}/Doxyfile @ONLY)
  add_test(NAME docs.undocumented
           COMMAND ${attn_doc_python} ${CMAKE_CURRENT_LIST_DIR}/docs_api.py doxygen ${ATTN_DOXYGEN}
                   ${ATTN_DOXYGEN_OUT}/Doxyfile ${ATTN_DOXYGEN_OUT}/warnings.txt)
  set_tests_properties(docs.undocumented PROPERTIES LABELS docs TIMEOUT 120)
  set(attn_pydoc)
  if(TARGET attn_python)
    set(attn_pydoc COMMAND ${CMAKE_COMMAND} -E make_directory ${PROJECT_BINARY_DIR}/docs/python
                   COMMAND ${CMAKE_COMMAND} -E chdir ${PROJECT_BINARY_DIR}/docs/python
                           ${CMAKE_COMMAND} -E env PYTHONPATH=${PROJECT_BINARY_DIR}/python
                           ${attn_doc_python} -m pydoc -w attn attn._attn attn.torch attn.flash)
  endif()
  add_custom_target(docs
                    COMMAND ${ATTN_DOXYGEN} ${ATTN_DOXYGEN_OUT}/Doxyfile
                    ${attn_pydoc}
                    COMMENT "API reference: ${ATTN_DOXYGEN_OUT}/html, ${PROJECT_BINARY_DIR}/docs/python"
                    VERBATIM)
  if(TARGET attn_python)
    add_dependencies(docs attn_python)
  endif()
else()
  message(STATUS "doxygen not found: no `docs` target, no docs.undocumented test (scripts/setup.sh installs it)")
endif()

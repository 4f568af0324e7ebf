# The installed package, used as its users would (included by tests/CMakeLists.txt):
#   package.consumer  installs this build into a temporary prefix, builds examples/consumer against
#                     it with find_package(attn 0.2) and with pkg-config, runs both, and checks that
#                     `attn --version`, the headers' ATTN_VERSION_STRING and attn::version() agree.
#   package.kernels_alone  the same consumer, linking attn::attn alone, built with libpng and FreeType
#                     hidden from CMake, pkg-config, the compiler and the linker
#                     (tests/package_kernels_alone.sh): the kernels need neither.
#   package.public_headers  attn/attn.hpp includes or lists every header in include/attn, and no
#                     front end (tools/, python/src) reaches into attn::detail.
#   package.pip       `pip install .` into a temporary virtual environment, import, `pip uninstall`
#                     (tests/package_pip.sh); only where the Python module is built.
# Not in sanitizer builds: the consumer is compiled without the sanitizers the library would need.
if(NOT ATTN_SANITIZE AND NOT ATTN_TSAN)
  add_test(NAME package.consumer
           COMMAND sh ${CMAKE_CURRENT_LIST_DIR}/package_consumer.sh ${PROJECT_BINARY_DIR} ${PROJECT_SOURCE_DIR}
                   ${CMAKE_CURRENT_BINARY_DIR}/package_consumer ${PROJECT_VERSION})
  set_tests_properties(package.consumer PROPERTIES LABELS package TIMEOUT 300)
  add_test(NAME package.kernels_alone
           COMMAND sh ${CMAKE_CURRENT_LIST_DIR}/package_kernels_alone.sh ${PROJECT_BINARY_DIR} ${PROJECT_SOURCE_DIR}
                   ${CMAKE_CURRENT_BINARY_DIR}/package_kernels_alone)
  set_tests_properties(package.kernels_alone PROPERTIES LABELS package TIMEOUT 300)
  add_test(NAME package.public_headers
           COMMAND ${CMAKE_COMMAND} -DSOURCE_DIR=${PROJECT_SOURCE_DIR} -P ${CMAKE_CURRENT_LIST_DIR}/tools/package_headers.cmake)
  set_tests_properties(package.public_headers PROPERTIES LABELS package)
  if(TARGET attn_python)
    add_test(NAME package.pip
             COMMAND sh ${CMAKE_CURRENT_LIST_DIR}/package_pip.sh ${PROJECT_SOURCE_DIR} ${PROJECT_BINARY_DIR}
                     ${CMAKE_CURRENT_BINARY_DIR}/package_pip ${PROJECT_VERSION})
    set_tests_properties(package.pip PROPERTIES LABELS package TIMEOUT 300)
  endif()
endif()

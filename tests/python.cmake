# The Python module's tests (included by tests/CMakeLists.txt): each python/tests/test_*.py file is
# one CTest test, python.<file>, run by pytest under Debian's /usr/bin/python3 (the interpreter the
# module is built for) with PYTHONPATH set to the build's module, so that the build is tested, never a
# copy installed in site-packages. python.example runs examples/d2l_notebook.py the same way, its
# heatmaps written to build/tests/python_example; python.example_torch runs examples/torch_transformer.py,
# python.example_serve examples/serve_toy_decoder.py.
# Registered only when python/CMakeLists.txt built the module (not in sanitizer builds).
if(TARGET attn_python)
  file(GLOB attn_python_tests CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/python/tests/test_*.py)
  # ATTN_CLI: test_heatmaps.py compares show_heatmaps' pictures with the command line's.
  set(attn_python_env "PYTHONPATH=${PROJECT_BINARY_DIR}/python" "PYTHONDONTWRITEBYTECODE=1"
                      "ATTN_CLI=$<TARGET_FILE:attn_cli>")
  foreach(test_file ${attn_python_tests})
    get_filename_component(test_name ${test_file} NAME_WE)
    add_test(NAME python.${test_name}
             COMMAND ${Python3_EXECUTABLE} -m pytest -q -p no:cacheprovider ${test_file}
             WORKING_DIRECTORY ${PROJECT_SOURCE_DIR}/python/tests)
    set_tests_properties(python.${test_name} PROPERTIES LABELS python ENVIRONMENT "${attn_python_env}" TIMEOUT 600)
  endforeach()
  add_test(NAME python.example
           COMMAND ${Python3_EXECUTABLE} ${PROJECT_SOURCE_DIR}/examples/d2l_notebook.py ${CMAKE_CURRENT_BINARY_DIR}/python_example)
  set_tests_properties(python.example PROPERTIES LABELS python ENVIRONMENT "${attn_python_env}" TIMEOUT 300)
  # examples/torch_transformer.py, shortened: the textbook's and attn's MultiHeadAttention agree on the
  # same weights and both learn (the example exits 1 otherwise).
  add_test(NAME python.example_torch
           COMMAND ${Python3_EXECUTABLE} ${PROJECT_SOURCE_DIR}/examples/torch_transformer.py --steps 80
                   ${CMAKE_CURRENT_BINARY_DIR}/python_example_torch)
  set_tests_properties(python.example_torch PROPERTIES LABELS python ENVIRONMENT "${attn_python_env}" TIMEOUT 300
                                                       SKIP_REGULAR_EXPRESSION "No module named 'torch'")
  # examples/serve_toy_decoder.py at a small shape: continuous batching through KVCache.attend_batch,
  # its batched attention checked against one attend per sequence (the example exits 1 otherwise).
  add_test(NAME python.example_serve
           COMMAND ${Python3_EXECUTABLE} ${PROJECT_SOURCE_DIR}/examples/serve_toy_decoder.py --small --requests 6
                   --prompt-min 5 --prompt-max 60 --generate 5 --budget 40 --block-size 16)
  set_tests_properties(python.example_serve PROPERTIES LABELS python ENVIRONMENT "${attn_python_env}" TIMEOUT 300)
endif()

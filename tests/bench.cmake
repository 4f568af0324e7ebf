# bench/kernels.cpp (Google Benchmark) runs every benchmark once and reports sane figures
# (bench_kernels.py). Where the program is built: not in the sanitizer builds.
if(TARGET attn_kernels_bench)
  add_test(NAME bench.kernels COMMAND /usr/bin/python3 ${CMAKE_CURRENT_LIST_DIR}/bench_kernels.py
                                      $<TARGET_FILE:attn_kernels_bench>)
  set_tests_properties(bench.kernels PROPERTIES LABELS bench TIMEOUT 600)
endif()

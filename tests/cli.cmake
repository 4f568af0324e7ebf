# The `attn` command line, end to end (included by tests/CMakeLists.txt, which has already made
# the test_cli and test_cli_errors executables from their sources):
#   test_cli, test_cli_errors  GoogleTest suites that run the real binary on .npy files they write
#                              (tests/support/cli_runner.hpp), compare its outputs with the library's
#                              and check every error path's exit code and message;
#   cli.help_examples          runs the example printed by each subcommand's --help, as printed,
#                              with Debian's python3 and numpy writing the input files;
#   cli.numpy                  runs each subcommand on files numpy wrote (Fortran order, format
#                              versions 2.0 and 3.0) against the d2l chapter's formulas in numpy;
#   cli.bench                  `attn bench` on its decode cases (float32, 16-bit, int8): exit 0,
#                              every case in the JSON (tests/cli_bench.py; Release only);
#   cli.bench_serve            `attn bench --serve` on a tiny trace: every cache dtype reported, its
#                              figures positive and finite; bad trace options exit 2 naming the option
#                              (tests/cli_bench_serve.py; Release only);
#   cli.kreg                   `attn kreg` against local polynomial fits computed with numpy's least
#                              squares at given bandwidths (fit, slopes, asymptotic band), chosen
#                              bandwidths, bootstrap bands, plots, bad calls exiting 2 naming the
#                              option, and the demo's boundary comparison (tests/cli_kreg.py);
#   cli.memory_limit           runs too large for the memory attn may use (n = m = 2^20 weights,
#                              ATTN_MAX_BYTES) exit 1 naming the bytes; a malformed ATTN_MAX_BYTES
#                              exits 2 (tests/cli_memory_limit.py).
foreach(cli_test test_cli test_cli_errors)
  target_compile_definitions(${cli_test} PRIVATE ATTN_CLI="$<TARGET_FILE:attn_cli>")
  add_dependencies(${cli_test} attn_cli)
endforeach()

if(EXISTS /usr/bin/python3)
  add_test(NAME cli.help_examples
           COMMAND sh ${CMAKE_CURRENT_LIST_DIR}/cli_help_examples.sh $<TARGET_FILE:attn_cli>
                   ${CMAKE_CURRENT_BINARY_DIR}/cli_help_examples)
  set_tests_properties(cli.help_examples PROPERTIES LABELS cli SKIP_RETURN_CODE 77 TIMEOUT 120)
  add_test(NAME cli.numpy COMMAND /usr/bin/python3 ${CMAKE_CURRENT_LIST_DIR}/cli_numpy.py $<TARGET_FILE:attn_cli>
                                  ${CMAKE_CURRENT_BINARY_DIR}/cli_numpy)
  set_tests_properties(cli.numpy PROPERTIES LABELS cli SKIP_RETURN_CODE 77 TIMEOUT 120)
  # Release only: its full-size decode cases took 46 s under ASan, run alone; the suites run the
  # same kernels under ASan on small shapes.
  if(NOT ATTN_SANITIZE)
    add_test(NAME cli.bench COMMAND /usr/bin/python3 ${CMAKE_CURRENT_LIST_DIR}/cli_bench.py $<TARGET_FILE:attn_cli>)
    set_tests_properties(cli.bench PROPERTIES LABELS cli TIMEOUT 300 RUN_SERIAL TRUE)
    add_test(NAME cli.bench_serve COMMAND /usr/bin/python3 ${CMAKE_CURRENT_LIST_DIR}/cli_bench_serve.py $<TARGET_FILE:attn_cli>)
    set_tests_properties(cli.bench_serve PROPERTIES LABELS cli TIMEOUT 120 RUN_SERIAL TRUE)
  endif()
  add_test(NAME cli.kreg COMMAND /usr/bin/python3 ${CMAKE_CURRENT_LIST_DIR}/cli_kreg.py $<TARGET_FILE:attn_cli>
                                 ${CMAKE_CURRENT_BINARY_DIR}/cli_kreg)
  set_tests_properties(cli.kreg PROPERTIES LABELS cli SKIP_RETURN_CODE 77 TIMEOUT 300)
  add_test(NAME cli.memory_limit COMMAND /usr/bin/python3 ${CMAKE_CURRENT_LIST_DIR}/cli_memory_limit.py
                                         $<TARGET_FILE:attn_cli> ${CMAKE_CURRENT_BINARY_DIR}/cli_memory_limit)
  set_tests_properties(cli.memory_limit PROPERTIES LABELS cli TIMEOUT 120)
endif()

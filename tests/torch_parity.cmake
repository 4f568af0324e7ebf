# PyTorch parity (tests/test_torch_parity.cpp against tests/torch/make_cases.py), as a CTest fixture:
#   torch.make_cases           runs make_cases.py with Debian's python3-torch (/usr/bin/python3, not
#                              whatever python3 is first on PATH), writing build/tests/torch_cases;
#   torch/TorchParity.*/<case> the gtest cases of test_torch_parity, which require that fixture and
#                              find the cases through ATTN_TORCH_CASES.
# `ctest -R torch` runs them all. tests/CMakeLists.txt already builds test_torch_parity and
# discovers its tests like every other (at build time, so their names are only known to CTest);
# the properties are therefore set by a CTest include file that runs after the discovered list has
# been loaded, through the list variable gtest_discover_tests defines, test_torch_parity_TESTS.
# Without torch the fixture is not registered and the parity tests skip themselves (GTEST_SKIP,
# ATTN_TORCH_CASES unset).
set(ATTN_TORCH_PYTHON /usr/bin/python3)
set(ATTN_TORCH_CASES_DIR ${CMAKE_CURRENT_BINARY_DIR}/torch_cases)

execute_process(COMMAND ${ATTN_TORCH_PYTHON} -c "import torch, numpy"
                RESULT_VARIABLE attn_torch_import OUTPUT_QUIET ERROR_QUIET)
if(attn_torch_import EQUAL 0)
  add_test(NAME torch.make_cases
           COMMAND ${ATTN_TORCH_PYTHON} ${PROJECT_SOURCE_DIR}/tests/torch/make_cases.py ${ATTN_TORCH_CASES_DIR})
  set_tests_properties(torch.make_cases PROPERTIES FIXTURES_SETUP torch_cases LABELS torch TIMEOUT 600)

  set(attn_torch_props ${CMAKE_CURRENT_BINARY_DIR}/torch_parity_properties.cmake)
  file(WRITE ${attn_torch_props}
       "# Written by tests/torch_parity.cmake: the parity tests need the cases make_cases.py writes.\n"
       "if(DEFINED test_torch_parity_TESTS)\n"
       "  set_tests_properties(\${test_torch_parity_TESTS} PROPERTIES\n"
       "    FIXTURES_REQUIRED torch_cases\n"
       "    ENVIRONMENT \"ATTN_TORCH_CASES=${ATTN_TORCH_CASES_DIR}\"\n"
       "    LABELS torch)\n"
       "endif()\n")
  set_property(DIRECTORY APPEND PROPERTY TEST_INCLUDE_FILES ${attn_torch_props})
else()
  message(WARNING "attn: ${ATTN_TORCH_PYTHON} cannot import torch and numpy (install python3-torch); "
                  "the PyTorch parity tests are not registered with their cases and will skip")
endif()

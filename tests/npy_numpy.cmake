# The .npy reader and writer checked against numpy itself: npy_roundtrip.py writes arrays with
# numpy (every dtype, ranks 0-8, C and Fortran order, format versions 1.0, 2.0 and 3.0), copies each
# through attn with tools/npy_copy.cpp, and asserts that np.load gives back the same array.
# The test is skipped (exit code 77) when numpy cannot be imported.
add_executable(npy_copy ${CMAKE_CURRENT_LIST_DIR}/tools/npy_copy.cpp)
target_link_libraries(npy_copy PRIVATE attn_io)
if(EXISTS /usr/bin/python3)
  add_test(NAME npy_numpy_roundtrip
           COMMAND /usr/bin/python3 ${PROJECT_SOURCE_DIR}/tests/npy_roundtrip.py $<TARGET_FILE:npy_copy>)
  set_tests_properties(npy_numpy_roundtrip PROPERTIES LABELS numpy SKIP_RETURN_CODE 77 TIMEOUT 120)
else()
  message(STATUS "attn: /usr/bin/python3 not found; the numpy .npy round-trip test is not registered")
endif()

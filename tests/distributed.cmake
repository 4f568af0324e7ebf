# Sequence-parallel attention over MPI (attn/distributed.hpp), run by mpiexec on 1 to 4 ranks
# (oversubscribed on a 2-core machine, one OpenMP thread per rank): distributed.ranks_<P> runs
# tests/distributed/test_distributed.cpp on every rank, distributed.python_ranks_<P> runs
# tests/distributed/python_check.py (attn.distributed through mpi4py), distributed.ring_model checks
# bench/ring_model.py's shards and pair counts against attn's, distributed.memory_ranks_<P> the memory
# a rank adds in each call against the README's bounds (tests/distributed/memory_check.py). Only where attn_distributed is built;
# the Python checks where the Python modules are too.
if(TARGET attn_distributed)
  add_executable(test_distributed ${CMAKE_CURRENT_LIST_DIR}/distributed/test_distributed.cpp)
  target_link_libraries(test_distributed PRIVATE attn_distributed attn_test_support GTest::gtest)
  set(attn_mpi_env "OMP_NUM_THREADS=1;OMPI_MCA_btl_vader_single_copy_mechanism=none;OMPI_MCA_rmaps_base_oversubscribe=1")
  foreach(ranks 1 2 3 4)
    add_test(NAME distributed.ranks_${ranks}
             COMMAND ${MPIEXEC_EXECUTABLE} --allow-run-as-root --oversubscribe --bind-to none ${MPIEXEC_NUMPROC_FLAG}
                     ${ranks} $<TARGET_FILE:test_distributed>)
    # The shared-memory transport's single-copy mode needs ptrace rights containers often lack.
    set_tests_properties(distributed.ranks_${ranks} PROPERTIES LABELS distributed TIMEOUT 300 PROCESSORS 2
                         ENVIRONMENT "${attn_mpi_env}")
    if(TARGET attn_python_distributed)
      add_test(NAME distributed.python_ranks_${ranks}
               COMMAND ${MPIEXEC_EXECUTABLE} --allow-run-as-root --oversubscribe --bind-to none ${MPIEXEC_NUMPROC_FLAG}
                       ${ranks} ${Python3_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/distributed/python_check.py)
      set_tests_properties(distributed.python_ranks_${ranks} PROPERTIES LABELS distributed TIMEOUT 300 PROCESSORS 2
                           ENVIRONMENT "${attn_mpi_env};PYTHONPATH=${PROJECT_BINARY_DIR}/python;PYTHONDONTWRITEBYTECODE=1")
    endif()
  endforeach()
  if(TARGET attn_python_distributed)
    add_test(NAME distributed.ring_model COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/distributed/ring_model_check.py)
    set_tests_properties(distributed.ring_model PROPERTIES LABELS distributed TIMEOUT 120
                         ENVIRONMENT "PYTHONPATH=${PROJECT_BINARY_DIR}/python;PYTHONDONTWRITEBYTECODE=1")
    foreach(ranks 2 3 4)
      add_test(NAME distributed.memory_ranks_${ranks}
               COMMAND ${MPIEXEC_EXECUTABLE} --allow-run-as-root --oversubscribe --bind-to none ${MPIEXEC_NUMPROC_FLAG}
                       ${ranks} ${Python3_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/distributed/memory_check.py)
      # A fixed mmap threshold: glibc then returns freed buffers, so the peak counts live ones only.
      set_tests_properties(distributed.memory_ranks_${ranks} PROPERTIES LABELS distributed TIMEOUT 300 PROCESSORS 2
                           SKIP_RETURN_CODE 77 ENVIRONMENT
                           "${attn_mpi_env};MALLOC_MMAP_THRESHOLD_=65536;PYTHONPATH=${PROJECT_BINARY_DIR}/python;PYTHONDONTWRITEBYTECODE=1")
    endforeach()
  endif()
endif()

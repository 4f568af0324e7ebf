# package.public_headers (tests/package.cmake): cmake -DSOURCE_DIR=... -P tests/tools/package_headers.cmake
# The public surface is the product alone:
#   - attn/attn.hpp includes, or names in its comment, every header in include/attn;
#   - the front ends (tools/, python/src) use no attn::detail: what they need is public API, or a
#     probe of attn/diagnostics.hpp.
file(READ ${SOURCE_DIR}/include/attn/attn.hpp umbrella)
file(GLOB headers RELATIVE ${SOURCE_DIR}/include ${SOURCE_DIR}/include/attn/*.hpp)
set(missing "")
foreach(header ${headers})
  if(NOT header STREQUAL "attn/attn.hpp" AND NOT umbrella MATCHES "${header}")
    list(APPEND missing ${header})
  endif()
endforeach()
if(missing)
  message(FATAL_ERROR "attn/attn.hpp neither includes nor lists: ${missing}")
endif()

file(GLOB_RECURSE front_ends ${SOURCE_DIR}/tools/*.cpp ${SOURCE_DIR}/tools/*.hpp
     ${SOURCE_DIR}/python/src/*.cpp ${SOURCE_DIR}/python/src/*.hpp)
set(reaching "")
foreach(source ${front_ends})
  file(STRINGS ${source} lines REGEX "attn::detail|namespace attn::detail|using namespace attn")
  foreach(line ${lines})
    string(STRIP "${line}" line)
    list(APPEND reaching "${source}: ${line}")
  endforeach()
endforeach()
if(reaching)
  list(JOIN reaching "\n  " reaching)
  message(FATAL_ERROR "front ends reach into attn::detail:\n  ${reaching}")
endif()
message(STATUS "attn/attn.hpp covers every public header; no front end uses attn::detail")

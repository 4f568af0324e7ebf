// npy_copy IN OUT: reads IN with attn::io::read_npy and writes it to OUT with write_npy, so that
// npy_roundtrip.py can check attn's reader and writer against numpy. On an unreadable IN it prints
// attn's message to stderr and exits with 1; on wrong usage it exits with 2.
#include <cstdio>
#include <exception>

#include "attn/npy.hpp"

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: npy_copy IN.npy OUT.npy\n");
    return 2;
  }
  try {
    const attn::io::NpyArray array = attn::io::read_npy(argv[1]);
    attn::io::write_npy(argv[2], array.dtype, array.shape, array.bytes.data());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
  return 0;
}

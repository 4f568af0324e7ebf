#!/usr/bin/env python3
"""Checks attn's .npy reader and writer against numpy itself.

Usage: npy_roundtrip.py PATH/TO/npy_copy

For every dtype attn supports, ranks 0 to 8, C and Fortran order and format versions 1.0, 2.0
and 3.0, numpy writes an array, npy_copy reads it with attn::io::read_npy and writes it back with
write_npy, and np.load must return the same dtype, shape and values (NaN, -0.0, extreme integers
included). attn always writes version 1.0 in C order; for a C-order version 1.0 input its file must
be byte for byte numpy's. Files attn does not support must be refused with a message naming the file.
Exit status: 0 on success, 1 on any mismatch, 77 (CTest's skip) when numpy is missing.
"""
import os
import subprocess
import sys
import tempfile

try:
    import numpy as np
except ImportError:
    print("numpy cannot be imported; skipping the .npy round-trip check")
    sys.exit(77)

DTYPES = [np.float16, np.float32, np.float64, np.int32, np.int64, np.bool_]
SHAPES = [(), (5,), (0,), (2, 3), (3, 0), (2, 3, 4), (2, 1, 3, 2), (1, 2, 3, 1, 2, 1, 2, 1)]
VERSIONS = [None, (1, 0), (2, 0), (3, 0)]  # None: what np.save picks


def sample(dtype, shape, rng):
    """Values that catch a careless copy: specials for floats, extremes for integers."""
    n = int(np.prod(shape))
    if dtype == np.bool_:
        flat = rng.integers(0, 2, n).astype(np.bool_)
    elif np.issubdtype(dtype, np.integer):
        info = np.iinfo(dtype)
        flat = rng.integers(info.min, info.max, n, dtype=dtype, endpoint=True)
        flat[: min(n, 2)] = [info.min, info.max][: min(n, 2)]
    else:
        flat = rng.standard_normal(n).astype(dtype) * 1e3
        specials = np.array([np.nan, -0.0, np.inf, -np.inf, np.finfo(dtype).tiny / 4], dtype=dtype)
        flat[: min(n, 5)] = specials[: min(n, 5)]
    return flat.reshape(shape)


def write(path, array, version):
    with open(path, "wb") as f:
        np.lib.format.write_array(f, array, version=version)


def copy(tool, src, dst):
    return subprocess.run([tool, src, dst], capture_output=True, text=True, timeout=60)


def header_of(path):
    with open(path, "rb") as f:
        version = np.lib.format.read_magic(f)
        shape, fortran_order, dtype = np.lib.format._read_array_header(f, version)
    return version, fortran_order


def check_round_trips(tool, tmp, failures):
    rng = np.random.default_rng(20240501)
    count = 0
    for dtype in DTYPES:
        for shape in SHAPES:
            base = sample(dtype, shape, rng)
            layouts = [("C", base)] + ([("F", np.asfortranarray(base))] if len(shape) >= 2 else [])
            for order, array in layouts:
                for version in VERSIONS:
                    label = f"{np.dtype(dtype).name} {shape} {order} version={version}"
                    src, dst = os.path.join(tmp, "in.npy"), os.path.join(tmp, "out.npy")
                    write(src, array, version)
                    result = copy(tool, src, dst)
                    count += 1
                    if result.returncode != 0:
                        failures.append(f"{label}: npy_copy failed: {result.stderr.strip()}")
                        continue
                    back = np.load(dst)
                    if back.dtype != array.dtype or back.shape != array.shape:
                        failures.append(f"{label}: got {back.dtype} {back.shape}")
                    elif not np.array_equal(back, array, equal_nan=dtype not in (np.int32, np.int64, np.bool_)):
                        failures.append(f"{label}: values differ")
                    elif header_of(dst) != ((1, 0), False):
                        failures.append(f"{label}: attn wrote version/fortran_order {header_of(dst)}")
                    elif np.issubdtype(dtype, np.floating) and \
                            back.tobytes() != np.ascontiguousarray(array).tobytes():
                        failures.append(f"{label}: float bits differ (NaN payload or -0.0)")
                    elif order == "C" and version in (None, (1, 0)) and \
                            open(src, "rb").read() != open(dst, "rb").read():
                        failures.append(f"{label}: attn's file is not byte-identical to numpy's")
    return count


def check_refusals(tool, tmp, failures):
    """Arrays numpy writes but attn does not support: refused, naming the file and the reason."""
    cases = [
        (np.arange(3, dtype=">f4"), "is big-endian"),
        (np.arange(3, dtype=np.complex64), "'<c8' is not supported"),
        (np.arange(3, dtype=np.uint8), "'|u1' is not supported"),
        (np.zeros((1,) * 9, dtype=np.float32), "more than 8 dimensions"),
        (np.zeros(2, dtype=[("a", "<f4"), ("b", "<i4")]), "structured dtype"),
    ]
    for array, expected in cases:
        src, dst = os.path.join(tmp, "unsupported.npy"), os.path.join(tmp, "never.npy")
        write(src, array, None)
        result = copy(tool, src, dst)
        if result.returncode != 1 or expected not in result.stderr or src not in result.stderr:
            failures.append(f"{array.dtype} {array.shape}: expected exit 1 and '{expected}' naming {src}, got "
                            f"exit {result.returncode}: {result.stderr.strip()}")
    return len(cases)


def main():
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    tool = sys.argv[1]
    failures = []
    with tempfile.TemporaryDirectory(prefix="attn_npy_") as tmp:
        copied = check_round_trips(tool, tmp, failures)
        refused = check_refusals(tool, tmp, failures)
    for failure in failures:
        print("FAIL", failure)
    print(f"{copied} numpy files copied through attn, {refused} unsupported files refused, "
          f"{len(failures)} failures (numpy {np.__version__})")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""dequant.py - the reference dequantizer for tests/test_quants.c.

Usage: dequant.py TYPE_ID IN OUT
  IN holds whole blocks of GGUF/ggml type TYPE_ID (the numeric ggml_type id); OUT receives the dequantized values
  as little-endian float32, computed by the gguf Python package's NumPy code (gguf.quants.dequantize), which is
  independent of flashlm's C code.
       dequant.py --quantize TYPE_ID IN OUT
  the other way: IN holds little-endian float32 values (whole blocks), OUT receives gguf.quants.quantize's blocks.
       dequant.py --check
  exit 0 when the gguf package can be imported, else print why and exit 3.
Exit status: 0 ok, 2 usage or input error, 3 the gguf/numpy packages are missing.
"""
import sys


def main(argv):
    try:
        import numpy as np
        import gguf
        from gguf.quants import dequantize
    except ImportError as e:  # the C test turns this into a clear failure (or a skip when allowed)
        print(f"dequant.py: cannot import the gguf/numpy packages ({e}); "
              "install them with: python3 -m pip install gguf numpy", file=sys.stderr)
        return 3
    if len(argv) == 2 and argv[1] == "--check":
        return 0
    quantize = len(argv) == 5 and argv[1] == "--quantize"
    if quantize:
        argv = argv[1:]
    if len(argv) != 4:
        print(__doc__, file=sys.stderr)
        return 2
    try:
        qtype = gguf.GGMLQuantizationType(int(argv[1]))
    except ValueError:
        print(f"dequant.py: unknown type id {argv[1]}", file=sys.stderr)
        return 2
    block_elems, block_bytes = gguf.GGML_QUANT_SIZES[qtype]
    if quantize:
        x = np.fromfile(argv[2], dtype="<f4")
        if x.size % block_elems:
            print(f"dequant.py: {x.size} values is not a whole number of {qtype.name} blocks", file=sys.stderr)
            return 2
        gguf.quants.quantize(x.reshape(-1, block_elems), qtype).astype(np.uint8).tofile(argv[3])
        return 0
    data = np.fromfile(argv[2], dtype=np.uint8)
    if data.size % block_bytes:
        print(f"dequant.py: {argv[2]}: {data.size} bytes is not a whole number of {qtype.name} blocks "
              f"({block_bytes} bytes)", file=sys.stderr)
        return 2
    out = dequantize(data.reshape(-1, block_bytes), qtype).astype("<f4").reshape(-1)
    if out.size != data.size // block_bytes * block_elems:
        print(f"dequant.py: {out.size} values for {data.size // block_bytes} blocks", file=sys.stderr)
        return 2
    out.tofile(argv[3])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

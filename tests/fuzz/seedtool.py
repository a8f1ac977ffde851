#!/usr/bin/env python3
"""seedtool.py — pieces of model files for the fuzz seed corpora (tests/fuzz/make_seeds.sh). Standard library only.

  seedtool.py chat-template FILE.gguf OUT     tokenizer.chat_template of a GGUF (nothing written when it has none)
  seedtool.py region FILE.flm KIND OUT        the payload of the first region of KIND (1 resident, 2 FFN, 3 predictor)
  seedtool.py prefix BYTES IN OUT             OUT = BYTES (hex) + the contents of IN
  seedtool.py lines N PREFIXES TEXT OUTDIR    up to N lines of TEXT, each written once per prefix (hex, comma-separated)
"""
import struct
import sys

SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}


def gguf_kvs(path):
    """Yield (key, type, value) for the GGUF's metadata; string values as bytes, arrays skipped (value None)."""
    with open(path, "rb") as f:
        data = f.read(64 << 20)  # the metadata of every model flashlm pulls lies in the first 64 MiB
    if data[:4] != b"GGUF":
        return
    n_kv = struct.unpack_from("<Q", data, 16)[0]
    pos = 24

    def string(p):
        n = struct.unpack_from("<Q", data, p)[0]
        return data[p + 8:p + 8 + n], p + 8 + n

    for _ in range(n_kv):
        key, pos = string(pos)
        t = struct.unpack_from("<I", data, pos)[0]
        pos += 4
        if t == 8:
            val, pos = string(pos)
            yield key.decode("utf-8", "replace"), t, val
        elif t == 9:
            et, n = struct.unpack_from("<IQ", data, pos)
            pos += 12
            if et == 8:
                for _ in range(n):
                    _, pos = string(pos)
            else:
                pos += SIZES[et] * n
            yield key.decode("utf-8", "replace"), t, None
        else:
            pos += SIZES[t]
            yield key.decode("utf-8", "replace"), t, None


def main(argv):
    cmd = argv[1]
    if cmd == "chat-template":
        for key, t, val in gguf_kvs(argv[2]):
            if key == "tokenizer.chat_template" and t == 8:
                open(argv[3], "wb").write(val)
    elif cmd == "region":
        data = open(argv[2], "rb").read()
        n = struct.unpack_from("<I", data, 12)[0]
        for i in range(n):
            kind, _, off, size = struct.unpack_from("<IIQQ", data, 64 + 64 * i)
            if kind == int(argv[3]):
                open(argv[4], "wb").write(data[off:off + size])
                return
    elif cmd == "prefix":
        open(argv[4], "wb").write(bytes.fromhex(argv[2]) + open(argv[3], "rb").read())
    elif cmd == "lines":
        n, prefixes, text, outdir = int(argv[2]), argv[3].split(","), argv[4], argv[5]
        lines = [l for l in open(text, "rb").read().split(b"\n") if l.strip()][:n]
        for i, line in enumerate(lines):
            for p in prefixes:
                open("%s/%s-%03d" % (outdir, p, i), "wb").write(bytes.fromhex(p) + line[:512])
    else:
        sys.exit("seedtool.py: unknown command " + cmd)


if __name__ == "__main__":
    main(sys.argv)

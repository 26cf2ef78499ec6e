#!/usr/bin/env python3
"""Writes the seed corpus of the fuzz targets (tests/fuzz/corpus/<target>/) and the inputs that
show known bugs (tests/fuzz/known_bugs/<target>/), from the wire tables in
include/cohort/transport/detail/tcp_wire.hpp and include/cohort/rendezvous/detail/
tcp_store_protocol.hpp. The output is committed; rerun after a protocol change:

    python3 tests/fuzz/make_corpus.py
"""

import hashlib
import os
import random
import shutil
import struct

HERE = os.path.dirname(os.path.abspath(__file__))

# tcp_wire.hpp
HELLO_MAGIC = 0x3150435454524843
PROTOCOL_VERSION = 1
MARK = 0xC7


def frame(ftype, payload, length=None, mark=MARK, reserved=0):
    length = len(payload) if length is None else length
    return struct.pack("<IBBH", length & 0xFFFFFFFF, ftype, mark, reserved) + payload


def data(payload, **kw):
    return frame(1, payload, **kw)


def abort(origin, value, cat, text, text_len=None):
    text_len = len(text) if text_len is None else text_len
    payload = struct.pack("<iiBxxxI", origin, value, cat, text_len) + text
    return frame(2, payload)


def hello(rank, size, job, token, magic=HELLO_MAGIC, version=PROTOCOL_VERSION, jl=None, tl=None,
          reserved=b"\0" * 8):
    jl = len(job) if jl is None else jl
    tl = len(token) if tl is None else tl
    b = struct.pack("<QIiiHH", magic, version, rank, size, jl, tl) + reserved
    b += job.ljust(128, b"\0")[:128] + token.ljust(96, b"\0")[:96]
    return b


def leaving(origin, value, cat, text, text_len=None):
    """A rank's answer to a hello when it gives up on the job: a refusal with rank -2, then an
    abort payload."""
    text_len = len(text) if text_len is None else text_len
    b = struct.pack("<QIi", HELLO_MAGIC, PROTOCOL_VERSION, -2)
    b += struct.pack("<iiBxxxI", origin, value, cat, text_len) + text
    return b.ljust(256, b"\0")[:256]


# tcp_store_protocol.hpp
STORE_MAGIC = 0x524F545354524843
SET, GET, ADD, WAIT = 1, 2, 3, 4


def store_hello(nonce=b"\x07" * 32, magic=STORE_MAGIC, version=2, flags=0):
    """A client's hello, or (with flags) a server's challenge."""
    return struct.pack("<QII", magic, version, flags) + nonce[:32].ljust(32, b"\0")


def verdict(status=0, proof=b"\0" * 32, magic=STORE_MAGIC):
    return struct.pack("<QB7x", magic, status) + proof[:32].ljust(32, b"\0")


def request(op, key=b"", value=b"", arg=0, kl=None, vl=None):
    kl = len(key) if kl is None else kl
    vl = len(value) if vl is None else vl
    return struct.pack("<BxxxIIIq", op, kl, vl, 0, arg) + key + value


def keys(*ks):
    return struct.pack("<I", len(ks)) + b"".join(struct.pack("<I", len(k)) + k for k in ks)


def reply(status, payload=b"", number=0, length=None):
    length = len(payload) if length is None else length
    return struct.pack("<BxxxIq", status, length, number) + payload


def frames_seeds():
    rnd = random.Random(1)
    blob = bytes(rnd.randrange(256) for _ in range(3000))
    s = [
        b"\x00\x00" + data(b"x"),
        b"\x07\x01" + data(blob[:100]) + data(blob[100:1100]),
        b"\x10\x00" + data(blob) + data(blob[:17]),
        b"\x03\x05" + data(blob[:64]) + abort(1, 3, 0, b"rank 1 called all_gather #17") + data(blob[:10]),
        b"\x02\x00" + abort(1, 2, 0, b"lost rank 2"),
        b"\x02\x00" + abort(0, 5, 0, b"my own origin"),
        b"\x02\x01" + abort(1, 5, 1, b"generic category"),
        b"\x02\x01" + abort(1, 104, 2, b"system category"),
        b"\x05\x00" + data(blob[:40]) + abort(7, 5, 0, b"origin out of range"),
        b"\x05\x00" + data(blob[:40]) + abort(1, 5, 9, b"bad category"),
        b"\x05\x00" + data(blob[:40]) + abort(1, 5, 0, b"length lies", text_len=99),
        b"\x05\x00" + data(blob[:40]) + abort(1, 0, 0, b"code zero"),
        b"\x01\x01" + data(blob[:50], length=0xFFFFFFFF),
        b"\x01\x00" + data(b"", length=0),
        b"\x01\x00" + data(blob[:50], length=(1 << 20) + 1),
        b"\x01\x01" + data(blob[:500], length=2000),  # truncated
        b"\x04\x00" + data(blob[:30]) + data(blob[:30], mark=0),
        b"\x04\x00" + data(blob[:30]) + data(blob[:30], reserved=1),
        b"\x04\x00" + data(blob[:30]) + frame(3, b"unknown type"),
        b"\x04\x02" + data(blob[:30]) + frame(2, b"short", length=3),
        b"\x08\x04" + bytes(rnd.randrange(256) for _ in range(300)),
        b"\x09\x06" + b"".join(data(bytes([i]) * (i + 1)) for i in range(40)),
    ]
    return s


def handshake_seeds():
    # choice byte: job = [job, "", 128 x j, torchrun-1234][c & 3]; token = [secret, "", 96 x t,
    # s3cr3t-token-0123456789][(c >> 2) & 3]; world = 1 + ((c >> 4) & 7)
    c = (3 << 4) | (0 << 2) | 0  # "job", "secret", world 4
    ok = hello(2, 4, b"job", b"secret")
    return [
        bytes([c]) + ok,
        bytes([c]) + hello(0, 4, b"job", b"secret"),
        bytes([c]) + hello(3, 4, b"job", b"secret"),
        bytes([c]) + hello(4, 4, b"job", b"secret"),
        bytes([c]) + hello(-1, 4, b"job", b"secret"),
        bytes([c]) + hello(2, 5, b"job", b"secret"),
        bytes([c]) + hello(2, 4, b"job", b"secreT"),
        bytes([c]) + hello(2, 4, b"jog", b"secret"),
        bytes([c]) + hello(2, 4, b"job", b"secret", magic=HELLO_MAGIC ^ 1),
        bytes([c]) + hello(2, 4, b"job", b"secret", version=2),
        bytes([c]) + hello(2, 4, b"job", b"secret", jl=129),
        bytes([c]) + hello(2, 4, b"job", b"secret", tl=97),
        bytes([c]) + hello(2, 4, b"job", b"secret", reserved=b"\0\0\0\1\0\0\0\0"),
        bytes([c]) + ok[:100],  # truncated
        bytes([(1 << 4) | (1 << 2) | 1]) + hello(0, 2, b"", b""),
        bytes([(7 << 4) | (2 << 2) | 2]) + hello(7, 8, b"j" * 128, b"t" * 96),
        bytes([(0 << 4) | (3 << 2) | 3]) + hello(0, 1, b"torchrun-1234", b"s3cr3t-token-0123456789"),
        # leaving answers: rank 1 gave up (peer_lost), one whose text length runs past the end,
        # one from a rank outside the job
        bytes([c]) + leaving(1, 5, 0, b"rendezvous: lost rank 0 at 127.0.0.1:4000"),
        bytes([c]) + leaving(1, 5, 0, b"x" * 10, text_len=225),
        bytes([c]) + leaving(4, 5, 0, b"out of range"),
        # published addresses (parse_address reads the bytes after the choice byte)
        bytes([c]) + b"127.0.0.1 4000 3",
        bytes([c]) + b"::1 65535",
        bytes([c]) + b"10.0.0.2 65536 3",
    ]


def store_seeds():
    s = []
    # mode 0: decoders
    s.append(b"\x00\x00" + keys(b"a", b"cohort/job/addr/0"))
    s.append(b"\x00\x00" + keys())
    s.append(b"\x00\x00" + keys(b"x" * 300, b""))
    s.append(b"\x00\x00" + struct.pack("<I", 70000))
    s.append(b"\x00\x00" + request(SET, b"k", b"v")[:24])
    s.append(b"\x00\x00" + request(WAIT, b"", keys(b"a"), arg=100)[:24])
    # mode 1: the server; flag 1 prepends a proper hello ("tok"), flag 2: no token
    s.append(b"\x01\x01" + request(SET, b"k", b"v") + request(GET, b"k") + request(ADD, b"n", arg=5) +
             request(ADD, b"n", arg=-7) + request(GET, b"absent"))
    s.append(b"\x01\x01" + request(WAIT, b"", keys(b"k"), arg=0) + request(SET, b"k", b"v"))
    s.append(b"\x01\x01" + request(SET, b"k", b"v") + request(WAIT, b"", keys(b"k"), arg=1000) + request(GET, b"k"))
    s.append(b"\x01\x01" + request(WAIT, b"", keys(b"never"), arg=20))
    s.append(b"\x01\x01" + request(SET, b"n", b"not a number") + request(ADD, b"n", arg=1))
    s.append(b"\x01\x01" + request(SET, b"k", b"", vl=0x7FFFFFFF))
    s.append(b"\x01\x01" + request(SET, b"", b"v"))
    s.append(b"\x01\x01" + request(GET, b"k", b"v"))
    s.append(b"\x01\x01" + request(WAIT, b"k", keys(b"k")))
    s.append(b"\x01\x01" + request(WAIT, b"", b"\x05\x00\x00\x00"))
    s.append(b"\x01\x01" + request(9, b"k"))
    s.append(b"\x01\x01" + request(SET, b"k" * 4097, b"v"))
    s.append(b"\x01\x01" + request(SET, b"k", b"v")[:20])
    # flag 0: the input is the whole stream, hello and proof included (a token server's nonce
    # is random, so a proof in the input is wrong: these show the refusals)
    s.append(b"\x01\x00" + store_hello() + b"\0" * 32 + request(SET, b"a", b"b"))
    s.append(b"\x01\x00" + store_hello() + b"\x55" * 32)
    s.append(b"\x01\x00" + store_hello(magic=1))
    s.append(b"\x01\x00" + store_hello(version=1))
    s.append(b"\x01\x00" + store_hello(version=7))
    s.append(b"\x01\x00" + store_hello(flags=5))
    s.append(b"\x01\x00" + store_hello()[:10])
    s.append(b"\x01\x00" + struct.pack("<QIHH", STORE_MAGIC, 1, 3, 0) + b"tok")  # a version 1 hello
    # flag 2: no token (this user's processes are admitted): a raw hello and proof get in
    s.append(b"\x01\x02" + store_hello() + b"\0" * 32 + request(SET, b"x", b"1") + request(ADD, b"x", arg=41))
    s.append(b"\x01\x03" + request(SET, b"x", b"-9223372036854775808") + request(ADD, b"x", arg=-1) +
             request(GET, b"x") + request(ADD, b"y", arg=-9223372036854775808) + request(ADD, b"y", arg=-1))
    s.append(b"\x01\x01" + request(ADD, b"z", arg=9223372036854775807) + request(ADD, b"z", arg=9223372036854775807))
    # fixed once (bug 5): add overflowed int64 in the server (undefined behaviour)
    s.append(("add_overflow", b"\x01\x01" + request(SET, b"x", b"9223372036854775807") + request(ADD, b"x", arg=1)))
    # mode 2: the client; the fake server answers the hello, then sends these replies (flag 1:
    # the input brings its own answer to the hello)
    s.append(b"\x02\x00" + reply(0) + reply(0, b"value") + reply(0, number=7))
    s.append(b"\x02\x00" + reply(2, keys(b"cohort/j/addr/1"), 1) + reply(1) + reply(3, b"not an integer"))
    s.append(b"\x02\x00" + reply(2, b"\x01\x00"))
    s.append(b"\x02\x00" + reply(9))
    s.append(b"\x02\x00" + reply(0, length=0x7FFFFFFF))
    s.append(b"\x02\x00" + reply(0, b"abc", length=10))
    s.append(b"\x02\x00" + reply(2, keys(b"cohort/j/addr/1", b"cohort/j/addr/7"), 2))
    s.append(b"\x02\x00" + reply(2, keys(b"cohort/j/addr/-1"), 1))
    s.append(b"\x02\x00" + reply(2, keys(b"cohort/j/addr/01"), 1))
    s.append(b"\x02\x00" + reply(2, keys(b"cohort/j/addr/99999999999999999999"), 1))
    s.append(b"\x02\x00" + reply(2, keys(b"other/1"), 1))
    # fixed once (bug 6): wait_for_ranks let std::stoi throw on a key name the store sent back
    s.append(("stoi_on_store_key", b"\x02\x00" + reply(2, keys(b"cohort/j/addr/zero"), 1)))
    # flag 1: the input answers the hello itself: a challenge, then a verdict
    s.append(b"\x02\x01" + store_hello(flags=1) + verdict(0) + reply(0))
    s.append(b"\x02\x01" + store_hello(flags=0) + verdict(0) + reply(0))
    s.append(b"\x02\x01" + store_hello(flags=1) + verdict(1))
    s.append(b"\x02\x01" + store_hello(flags=1) + verdict(2))
    s.append(b"\x02\x01" + store_hello(flags=1) + verdict(9))
    s.append(b"\x02\x01" + store_hello(flags=1, version=1))
    s.append(b"\x02\x01" + store_hello(flags=1)[:20])
    s.append(b"\x02\x01" + b"HTTP/1.1 400 Bad Request\r\n\r\n")
    return s


def known_bug_seeds():
    """Inputs that show open bugs, by target: (name, bytes) pairs. When one is fixed, its entry
    moves to the target's seeds under the same name, and its name leaves meson's known_bugs."""
    return {}


def write(directory, inputs):
    shutil.rmtree(directory, ignore_errors=True)
    os.makedirs(directory)
    for data in inputs:
        name = data[0] if isinstance(data, tuple) else hashlib.sha1(data).hexdigest()[:16]
        blob = data[1] if isinstance(data, tuple) else data
        with open(os.path.join(directory, name), "wb") as f:
            f.write(blob)


def main():
    write(os.path.join(HERE, "corpus", "frames"), frames_seeds())
    write(os.path.join(HERE, "corpus", "handshake"), handshake_seeds())
    write(os.path.join(HERE, "corpus", "store"), store_seeds())
    for target, inputs in known_bug_seeds().items():
        write(os.path.join(HERE, "known_bugs", target), inputs)


if __name__ == "__main__":
    main()

"""Hand-made ustar bytes for hostile-shard tests and the audit (benchmarks/hostile_audit.py):
headers whose size field says what a test wants, which tarfile would not write."""


def tar_header(name: str, size: int, typ: bytes = b"0") -> bytes:
    h = bytearray(512)
    h[0 : len(name)] = name.encode()
    h[100:108] = b"0000644\0"
    h[124:136] = b"%011o\0" % size
    h[156:157] = typ
    h[257:263] = b"ustar\0"
    h[148:156] = b" " * 8
    h[148:156] = b"%06o\0 " % sum(h)
    return bytes(h)


def tar_member(name: str, data: bytes) -> bytes:
    return tar_header(name, len(data)) + data + b"\0" * (-len(data) % 512)

"""CRC-32C (Castagnoli) of many byte strings at once, in numpy, and TFRecord's masked form,
for checking TFRecord files without a compiled crc32c library.

The CRC register is linear over GF(2): the register after a message is the XOR over its bytes
of P[k][byte], the register that byte alone leaves when k more bytes follow it. With a table P
for k < BLOCK, a string's bytes are gathered from P in one vectorised pass and XOR-reduced per
(string, block of BLOCK bytes); longer strings fold their blocks together with the table's
last rows (the register moved through BLOCK zero bytes). CRC-32C's initial value 0xFFFFFFFF
equals inverting the first 4 bytes of the message; its final XOR is one more inversion."""
from __future__ import annotations

import numpy as np

_POLY = 0x82F63B78  # CRC-32C, reflected
BLOCK = 4096  # table rows: 4 MiB of uint32
_MASK_DELTA = 0xA282EAD8


def _byte_table() -> np.ndarray:
    table = np.arange(256, dtype=np.uint32)
    for _ in range(8):
        table = np.where(table & 1, (table >> 1) ^ np.uint32(_POLY), table >> 1)
    return table.astype(np.uint32)


def _position_table() -> np.ndarray:
    """P[k][b]: the register after byte b followed by k zero bytes, from register 0."""
    byte = _byte_table()
    table = np.empty((BLOCK, 256), dtype=np.uint32)
    table[0] = byte
    for k in range(1, BLOCK):
        previous = table[k - 1]
        table[k] = (previous >> 8) ^ byte[previous & 0xFF]
    return table


_TABLE = None


def _table() -> np.ndarray:
    global _TABLE
    if _TABLE is None:
        _TABLE = _position_table()
    return _TABLE


def _through_block(registers: np.ndarray) -> np.ndarray:
    """Registers moved through BLOCK zero bytes: the register's 4 bytes act as message bytes
    followed by BLOCK - 1 - j more."""
    table = _table()
    out = np.zeros_like(registers)
    for j in range(4):
        out ^= table[BLOCK - 1 - j][(registers >> np.uint32(8 * j)) & 0xFF]
    return out


def _slow_crc32c(data: bytes) -> int:
    """Bytewise, for strings shorter than 4 bytes (the vectorised form needs 4)."""
    byte, register = _byte_table(), 0xFFFFFFFF
    for b in data:
        register = (register >> 8) ^ int(byte[(register ^ b) & 0xFF])
    return register ^ 0xFFFFFFFF


def crc32c_many(blob, starts: np.ndarray, stops: np.ndarray) -> np.ndarray:
    """CRC-32C of blob[starts[i]:stops[i]] for every i, as uint32 (non-overlapping, ascending
    ranges)."""
    data = np.frombuffer(blob, dtype=np.uint8)
    starts, stops = np.asarray(starts, np.int64), np.asarray(stops, np.int64)
    out = np.zeros(starts.size, dtype=np.uint32)
    lengths = stops - starts
    short = np.flatnonzero(lengths < 4)
    for i in short:
        out[i] = _slow_crc32c(bytes(data[starts[i]:stops[i]]))
    keep = np.flatnonzero(lengths >= 4)
    if keep.size:
        out[keep] = ~_linear_crc(data, starts[keep], stops[keep])
    return out


def _linear_crc(data: np.ndarray, starts: np.ndarray, stops: np.ndarray) -> np.ndarray:
    """Registers after each string from the initial value (strings of 4 bytes or more)."""
    lengths = stops - starts
    firsts = np.cumsum(lengths) - lengths  # where each string starts in `message`
    where = np.arange(int(lengths.sum()), dtype=np.int64)
    distance = np.repeat(firsts + lengths - 1, lengths) - where  # bytes after this one
    message = data[where + np.repeat(starts - firsts, lengths)]
    head = (firsts[:, None] + np.arange(4)).reshape(-1)  # initial register: first 4 inverted
    message[head] = ~message[head]
    values = _table().reshape(-1)[((distance % BLOCK) << 8) | message]
    if lengths.max() <= BLOCK:
        return np.bitwise_xor.reduceat(values, firsts)
    # XOR-reduce each run of bytes of one (string, block), then fold blocks, farthest first
    block = distance // BLOCK
    owner = np.repeat(np.arange(starts.size), lengths)
    runs = np.concatenate([[0], np.flatnonzero(np.diff(owner) | np.diff(block)) + 1])
    grouped = np.zeros((starts.size, int(block.max()) + 1), dtype=np.uint32)
    grouped[owner[runs], block[runs]] = np.bitwise_xor.reduceat(values, runs)
    register = np.zeros(starts.size, dtype=np.uint32)
    for b in range(grouped.shape[1] - 1, -1, -1):
        register = _through_block(register) ^ grouped[:, b]
    return register


def masked(crc: np.ndarray) -> np.ndarray:
    """TFRecord's masked CRC: rotated right by 15 bits, plus a constant."""
    crc = np.asarray(crc, dtype=np.uint32)
    return ((crc >> np.uint32(15)) | (crc << np.uint32(17))) + np.uint32(_MASK_DELTA)

"""The soname (``DT_SONAME``) of an ELF shared library, and the symbols it exports, read from its sections.

The container's dynamic linker looks libraries up by soname (``libcuda.so.1``), while the driver installs
them by version (``libcuda.so.550.54.15``); the soname is what a CDI spec must make resolvable. Only
the section headers are read (``SHT_DYNAMIC`` and the string table it links to), which the driver's
stripped libraries keep. 32- and 64-bit, either byte order; anything unreadable gives None.
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import BinaryIO

_SHT_DYNAMIC = 6
_DT_NULL = 0
_DT_SONAME = 14
_MAX_SECTIONS = 4096


_SHT_DYNSYM = 11
_SHN_UNDEF = 0
#: Exported symbols read at most (the driver's libnvidia-ml exports a few hundred).
_MAX_SYMBOLS = 100_000


def _sections(f: BinaryIO) -> tuple[str, bool, list[tuple[int, int, int, int, int]]] | None:
    """Byte order, width and ``(type, offset, size, link, entsize)`` of each section, or None."""
    data = f.read(64)
    if len(data) < 52 or data[:4] != b"\x7fELF":
        return None
    is64 = data[4] == 2
    order = "<" if data[5] == 1 else ">"
    if is64:
        shoff, = struct.unpack_from(order + "Q", data, 0x28)
        shentsize, shnum = struct.unpack_from(order + "HH", data, 0x3A)
    else:
        shoff, = struct.unpack_from(order + "I", data, 0x20)
        shentsize, shnum = struct.unpack_from(order + "HH", data, 0x2E)
    if not shoff or not 0 < shnum <= _MAX_SECTIONS:
        return None
    f.seek(shoff)
    table = f.read(shentsize * shnum)
    sections = []
    for i in range(shnum):
        at = i * shentsize
        if is64:
            _, stype, _, _, off, size, link, _, _, entsize = struct.unpack_from(order + "IIQQQQIIQQ", table, at)
        else:
            _, stype, _, _, off, size, link, _, _, entsize = struct.unpack_from(order + "IIIIIIIIII", table, at)
        sections.append((stype, off, size, link, entsize))
    return order, is64, sections


def exported_symbols(path: Path, prefix: str = "") -> tuple[str, ...] | None:
    """The names a shared library defines in its dynamic symbol table (``SHT_DYNSYM``, defined entries
    only), starting with ``prefix``, sorted; None when the file is no ELF library we can read. What a
    support engineer compares with the NVML calls an agent makes (an old driver lacks newer symbols)."""
    try:
        with path.open("rb") as f:
            parsed = _sections(f)
            if parsed is None:
                return None
            order, is64, sections = parsed
            names: set[str] = set()
            for stype, off, size, link, entsize in sections:
                if stype != _SHT_DYNSYM or link >= len(sections):
                    continue
                _, str_off, str_size, _, _ = sections[link]
                f.seek(str_off)
                strings = f.read(str_size)
                f.seek(off)
                table = f.read(size)
                entry = struct.Struct(order + ("IBBHQQ" if is64 else "IIIBBH"))
                step = entsize or entry.size
                for i in range(min(len(table) // step, _MAX_SYMBOLS)):
                    fields = entry.unpack_from(table, i * step)
                    name_at, shndx = (fields[0], fields[3]) if is64 else (fields[0], fields[5])
                    if shndx == _SHN_UNDEF or not name_at or name_at >= len(strings):
                        continue
                    name = strings[name_at:strings.index(b"\0", name_at)].decode("ascii", "replace")
                    if name.startswith(prefix):
                        names.add(name)
            return tuple(sorted(names))
    except (OSError, struct.error, ValueError):
        return None


def soname(path: Path) -> str | None:
    try:
        with path.open("rb") as f:
            parsed = _sections(f)
            if parsed is None:
                return None
            order, is64, sections = parsed
            for stype, off, size, link, _ in sections:
                if stype != _SHT_DYNAMIC or link >= len(sections):
                    continue
                f.seek(off)
                dyn = f.read(size)
                entry = struct.Struct(order + ("qQ" if is64 else "iI"))
                name_at = None
                for i in range(len(dyn) // entry.size):
                    tag, value = entry.unpack_from(dyn, i * entry.size)
                    if tag == _DT_NULL:
                        break
                    if tag == _DT_SONAME:
                        name_at = value
                if name_at is None:
                    return None
                _, str_off, str_size, _, _ = sections[link]
                if name_at >= str_size:
                    return None
                f.seek(str_off + name_at)
                raw = f.read(min(256, str_size - name_at))
                return raw.split(b"\0", 1)[0].decode("ascii", "replace") or None
    except (OSError, struct.error):
        return None
    return None

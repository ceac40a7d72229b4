"""data=text's default corpus: Jane Austen's six novels as UTF-8 text files, made offline from
Debian's r-cran-janeaustenr (`make corpus` runs this).

The package (MIT; the novels themselves are Project Gutenberg's public-domain texts, 4.0 MB) keeps
them as R data: a lazy-load database (Rdata.rdx: the index, Rdata.rdb: the objects), each novel a
character vector with one element per line. R itself is not needed: the package's .deb is fetched
with `apt-get download` (no install, so none of R's 55 MB of dependencies) and unpacked with
dpkg-deb, and the few R serialization types these objects use are read here. Standard library
only, so that it runs before any virtual environment exists.

    python3 scripts/austen_corpus.py OUT_DIR [--from DIR]

OUT_DIR gets one file per novel, named by year of publication so that a folder read in name
order holds them in the order Austen published them (the held-out tail is then Persuasion's).
Nothing is printed when OUT_DIR is already there; the folder appears whole or not at all.
"""

from __future__ import annotations

import argparse
import bz2
import gzip
import lzma
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import zlib
from pathlib import Path

PACKAGE = "r-cran-janeaustenr"
#: Where the Debian package installs the R package, when someone installed it.
INSTALLED = Path("/usr/lib/R/site-library/janeaustenr")
#: The R object's name -> the file it becomes, in order of publication.
NOVELS = {
    "sensesensibility": "1811-sense-and-sensibility.txt",
    "prideprejudice": "1813-pride-and-prejudice.txt",
    "mansfieldpark": "1814-mansfield-park.txt",
    "emma": "1815-emma.txt",
    "northangerabbey": "1817-northanger-abbey.txt",
    "persuasion": "1817-persuasion.txt",
}


class RReader:
    """R's XDR serialization (format 2 or 3), the types that a saved character vector and a
    lazy-load index use; anything else is refused by name rather than misread."""

    def __init__(self, data: bytes):
        if data[:2] != b"X\n":
            raise ValueError(f"not R's XDR serialization (starts {data[:2]!r})")
        self.data, self.pos, self.refs = data, 2, []
        version = self.int()
        self.pos += 8  # the writer's and the minimal reader's R versions
        if version == 3:
            self.pos += 4 + self.int()  # the native encoding's name

    def int(self) -> int:
        (value,) = struct.unpack_from(">i", self.data, self.pos)
        self.pos += 4
        return value

    def item(self):
        flags = self.int()
        kind, has_attr, has_tag = flags & 0xFF, flags & (1 << 9), flags & (1 << 10)
        if kind in (254, 253, 252, 251, 250, 242, 241):  # NULL and the special environments
            return None
        if kind == 255:  # a reference to an earlier symbol
            return self.refs[(flags >> 8 or self.int()) - 1]
        if kind == 1:  # a symbol: its name, remembered for later references
            self.refs.append(self.item())
            return self.refs[-1]
        if kind == 9:  # a string (length -1: NA)
            return self.string(flags)
        if kind in (2, 6, 17):  # a pairlist cell: (tag, value) then the rest
            if has_attr:
                self.item()
            tag = self.item() if has_tag else None
            head = (tag, self.item())
            return [head] + (self.item() or [])
        if kind in (16, 19, 20, 10, 13):
            return self.vector(kind, has_attr)
        raise ValueError(f"R object type {kind} is not one this reader knows")

    def string(self, flags: int) -> str | None:
        length = self.int()
        if length == -1:
            return None
        raw = self.data[self.pos : self.pos + length]
        self.pos += length
        return raw.decode("latin-1" if flags & (1 << 14) else "utf-8")

    def vector(self, kind: int, has_attr: int):
        length = self.int()
        if kind in (10, 13):  # logical or integer
            values = list(struct.unpack_from(f">{length}i", self.data, self.pos))
            self.pos += 4 * length
        else:  # character vector or list
            values = [self.item() for _ in range(length)]
        attributes = dict(self.item()) if has_attr else {}
        names = attributes.get("names")
        return dict(zip(names, values)) if names else values


def read_lazyload(directory: Path) -> dict:
    """name -> object of an R lazy-load database (data/Rdata.rdx and data/Rdata.rdb)."""
    index = RReader(gzip.decompress((directory / "Rdata.rdx").read_bytes())).item()
    blob = (directory / "Rdata.rdb").read_bytes()
    objects = {}
    for name, (offset, length) in index["variables"].items():
        objects[name] = RReader(decompress(blob[offset : offset + length], index["compressed"])).item()
    return objects


def decompress(record: bytes, compressed) -> bytes:
    """One record of an .rdb file: its uncompressed length, then zlib (compressed=1), or a type
    byte and bzip2 / xz / nothing (2, 3)."""
    (size,) = struct.unpack_from(">I", record, 0)
    method = compressed[0] if isinstance(compressed, list) else compressed
    if method == 1:
        data = zlib.decompress(record[4:])
    else:
        body, kind = record[5:], record[4:5]
        data = {b"1": zlib.decompress, b"2": bz2.decompress, b"Z": lzma.decompress, b"0": bytes}[kind](body)
    if len(data) != size:
        raise ValueError(f"a record of {len(data)} bytes where the index says {size}")
    return data


def fetch_package(work: Path) -> Path:
    """The R package's folder, unpacked from the .deb that `apt-get download` brings (after an
    `apt-get update` when the package lists are missing and this is root)."""
    # apt's sandbox user must be able to write where the download lands.
    work.chmod(0o777)
    download = ["apt-get", "download", "-q", PACKAGE]
    done = subprocess.run(download, cwd=work, capture_output=True, text=True)
    if done.returncode != 0 and os.geteuid() == 0:
        subprocess.run(["apt-get", "update", "-q"], capture_output=True)
        done = subprocess.run(download, cwd=work, capture_output=True, text=True)
    debs = sorted(work.glob(f"{PACKAGE}_*.deb"))
    if done.returncode != 0 or not debs:
        raise RuntimeError(f"apt-get download {PACKAGE} failed: {(done.stderr or done.stdout).strip()[-300:]}")
    subprocess.run(["dpkg-deb", "-x", str(debs[0]), str(work / "root")], check=True)
    return work / "root" / INSTALLED.relative_to("/")


def write_novels(package: Path, out: Path) -> None:
    """The six novels into ``out``, whole or not at all: written beside it, then renamed."""
    objects = read_lazyload(package / "data")
    missing = sorted(set(NOVELS) - set(objects))
    if missing:
        raise RuntimeError(f"{package} lacks {', '.join(missing)}")
    out.parent.mkdir(parents=True, exist_ok=True)
    # Generated data, not source: the folder ignores itself.
    (out.parent / ".gitignore").write_text("*\n")
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        for name, file in NOVELS.items():
            lines = ["" if line is None else line for line in objects[name]]
            (staging / file).write_text("\n".join(lines) + "\n", encoding="utf-8")
        staging.chmod(0o755)  # mkdtemp's folder is private
        os.replace(staging, out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument(
        "--from", dest="source", type=Path, help="the R package's folder (default: installed or fetched)"
    )
    args = parser.parse_args(argv)
    if args.out.is_dir() and all((args.out / f).is_file() for f in NOVELS.values()):
        return 0
    if args.out.exists():
        print(f"austen_corpus: {args.out} is there but lacks some of {', '.join(NOVELS.values())}; remove it")
        return 1
    try:
        if args.source or (INSTALLED / "data" / "Rdata.rdb").is_file():
            write_novels(args.source or INSTALLED, args.out)
        else:
            with tempfile.TemporaryDirectory() as work:
                write_novels(fetch_package(Path(work)), args.out)
    except (OSError, ValueError, RuntimeError, subprocess.CalledProcessError) as err:
        print(f"austen_corpus: {err}", file=sys.stderr)
        return 1
    size = sum(p.stat().st_size for p in args.out.glob("*.txt"))
    print(f"wrote Jane Austen's six novels ({size / 1e6:.1f} MB, from Debian's {PACKAGE}) to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

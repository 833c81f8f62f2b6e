"""Directories to and from tar bytes (files.upload / files.download), refusing unsafe entries."""
from __future__ import annotations

import io
import os
import tarfile


def tar_of_dir(local_dir: str) -> bytes:
    """The directory's contents (not the directory itself) as a tar."""
    if not os.path.isdir(local_dir):
        raise ValueError(f"{local_dir} is not a directory")
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name in sorted(os.listdir(local_dir)):
            tar.add(os.path.join(local_dir, name), arcname=name)
    return buf.getvalue()


def extract_tar(data: bytes, local_dir: str) -> None:
    """Extracts into local_dir; absolute names, `..`, links out of it and device nodes are refused."""
    root = os.path.realpath(local_dir)
    os.makedirs(root, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
        members = tar.getmembers()
        for m in members:
            target = os.path.realpath(os.path.join(root, m.name))
            if os.path.isabs(m.name) or not (target == root or target.startswith(root + os.sep)):
                raise ValueError(f"unsafe tar entry {m.name!r}: outside {local_dir}")
            if m.isdev():
                raise ValueError(f"unsafe tar entry {m.name!r}: a device node")
            if m.issym() or m.islnk():
                base = root if m.islnk() else os.path.dirname(target)
                link = os.path.realpath(os.path.join(base, m.linkname))
                if os.path.isabs(m.linkname) or not (link == root or link.startswith(root + os.sep)):
                    raise ValueError(f"unsafe tar entry {m.name!r}: a link out of {local_dir}")
        for m in members:
            m.mode &= 0o7777 & ~0o6000  # no setuid/setgid files on the caller's machine
            if hasattr(tarfile, "data_filter"):  # Python >= 3.12 and recent 3.9-3.11: the same checks again
                tar.extract(m, root, set_attrs=not m.issym(), filter="data")
            else:
                tar.extract(m, root, set_attrs=not m.issym())

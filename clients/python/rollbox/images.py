"""
Images (`client.images`): import a `docker save` archive or an OCI image layout, streamed
from a file (never read whole); pull one from a registry and wait until it is ready; list,
get and delete image records. `AsyncImages` is the asyncio twin. An image's layers and
config, pulls and their registry settings: docs/images.md.
"""
from __future__ import annotations

import asyncio
import os
import time
from typing import IO, Any, AsyncIterator, Callable, Dict, Iterator, List, Optional, Union
from urllib.parse import quote, urlencode

from . import _core as core
from .errors import ERRORS_BY_CODE, Conflict, ImagePullTimeout, RollboxError

CHUNK_BYTES = 1 << 20
#: An import answers once every layer is built: minutes for an image of several GB.
IMPORT_READ_TIMEOUT_S = 3600.0

Source = Union[str, "os.PathLike[str]", IO[bytes]]


class ArchiveBody:
    """
    An archive sent in chunks as the transport pulls them. A path is opened again for each
    send, so the import (idempotent under its name) may be retried; an open file object can
    be sent once only (`started`). `on_progress(bytes_sent)` is called after each chunk.
    """

    def __init__(self, source: Source, on_progress: Optional[Callable[[int], None]] = None):
        self._source = source
        self._on_progress = on_progress
        self._reopenable = isinstance(source, (str, os.PathLike))
        self._sent_once = False

    @property
    def started(self) -> bool:
        return self._sent_once and not self._reopenable

    def chunks(self) -> Iterator[bytes]:
        if self.started:
            raise RuntimeError("an archive from a file object can be sent once only")
        self._sent_once = True
        sent = 0
        f = open(self._source, "rb") if self._reopenable else self._source  # type: ignore[arg-type]
        try:
            while True:
                chunk = f.read(CHUNK_BYTES)
                if not chunk:
                    return
                sent += len(chunk)
                yield chunk
                if self._on_progress:
                    self._on_progress(sent)
        finally:
            if self._reopenable:
                f.close()

    async def async_chunks(self) -> AsyncIterator[bytes]:
        chunks = self.chunks()
        while True:
            # A read of 1 MiB from a local file: off the event loop all the same.
            chunk = await asyncio.to_thread(next, chunks, None)
            if chunk is None:
                return
            yield chunk


def import_request(source: Source, name: str, platform: Optional[str], ref: Optional[str], on_progress: Optional[Callable[[int], None]]) -> core.Request:
    query = {"name": name, **({"platform": platform} if platform else {}), **({"ref": ref} if ref else {})}
    return core.Request("POST", f"/v1/images?{urlencode(query)}", headers={"content-type": "application/x-tar"},
                        stream=ArchiveBody(source, on_progress), read_timeout=IMPORT_READ_TIMEOUT_S)  # type: ignore[arg-type]


def layer_upload_request(tar: Union[bytes, str], name: Optional[str]) -> core.Request:
    """A rootfs tar as a layer: bytes as they are, a path streamed (never read whole; re-read on a retry)."""
    path = "/v1/layers" + (f"?name={quote(name, safe='')}" if name else "")
    body = {"content": tar} if isinstance(tar, bytes) else {"stream": ArchiveBody(tar)}
    return core.Request("POST", path, headers={"content-type": "application/x-tar"}, read_timeout=600, **body)  # type: ignore[arg-type]


def image_path(name: str) -> str:
    return f"/v1/images/{quote(name, safe='')}"


#: Between reads of a pulling image's record.
PULL_POLL_S = 0.5


def pull_request(ref: str, name: Optional[str], platform: Optional[str]) -> core.Request:
    # A retry of a pull joins the pull it started (same ref, same name): safe to send again.
    body = {"ref": ref, **({"name": name} if name else {}), **({"platform": platform} if platform else {})}
    return core.Request("POST", "/v1/images/pull", body=body)


class _PullWait:
    """Reads of a record until the pull `pull_id` has ended: the ready record, or the pull's error raised as its typed class."""

    def __init__(self, name: str, pull_id: Optional[str], timeout: Optional[float]):
        self.name, self.pull_id = name, pull_id
        self.deadline = None if timeout is None else time.monotonic() + timeout

    def settled(self, record: Dict[str, Any]) -> bool:
        pull = record.get("pull") or {}
        if self.pull_id is None:
            self.pull_id = pull.get("id")
        if pull.get("id") == self.pull_id and pull.get("state") == "pulling":
            if self.deadline is not None and time.monotonic() > self.deadline:
                raise ImagePullTimeout(f"image {self.name} is still being pulled", code="image_pull_timeout")
            return False
        if pull.get("id") == self.pull_id and pull.get("state") == "failed":
            error = pull.get("error") or {}
            code = str(error.get("code", "internal"))
            raise ERRORS_BY_CODE.get(code, RollboxError)(f"pulling {pull.get('ref')}: {error.get('message', 'failed')}", code=code)
        if record.get("state") == "ready":
            return True
        raise Conflict(f"image {self.name}: its pull {self.pull_id} is no longer its latest", code="conflict")


class Images:
    def __init__(self, client: core.Caller):
        self._client = client

    def import_archive(self, source: Source, *, name: str, platform: Optional[str] = None, ref: Optional[str] = None,
                       on_progress: Optional[Callable[[int], None]] = None) -> Dict[str, Any]:
        """
        Imports a `docker save` archive or an OCI layout (a path or a binary file object) as
        image `name`; answers its record with `import` (layersBuilt, layersReused, archiveBytes,
        durationMs). `platform` picks from a multi-platform index, `ref` an image of several.
        """
        return self._client._call(import_request(source, name, platform, ref, on_progress))

    def pull(self, ref: str, *, name: Optional[str] = None, platform: Optional[str] = None) -> Dict[str, Any]:
        """
        Starts pulling `ref` (`[registry/]name[:tag][@digest]`, as docker takes it) and answers
        the record at once: state `pulling` for a new image, with `pull` (its id, progress:
        layers and bytes done of total). A pull of the same ref already running is joined.
        """
        return self._client._call(pull_request(ref, name, platform))

    def wait(self, name: str, *, pull_id: Optional[str] = None, timeout: Optional[float] = None,
             on_progress: Optional[Callable[[Dict[str, Any]], None]] = None) -> Dict[str, Any]:
        """
        Waits until the pull `pull_id` (default: the name's latest) has ended: answers the
        ready record, or raises the pull's error (`RegistryUnauthorized`, `ImageNotFound`,
        `InvalidImage`, ...); `ImagePullTimeout` past `timeout` seconds.
        """
        waiting = _PullWait(name, pull_id, timeout)
        while True:
            record = self.get(name)
            if waiting.settled(record):
                return record
            if on_progress:
                on_progress(record)
            time.sleep(PULL_POLL_S)

    def pull_and_wait(self, ref: str, *, name: Optional[str] = None, platform: Optional[str] = None, timeout: Optional[float] = None,
                      on_progress: Optional[Callable[[Dict[str, Any]], None]] = None) -> Dict[str, Any]:
        """`pull`, then `wait` for that pull: the ready image record."""
        started = self.pull(ref, name=name, platform=platform)
        return self.wait(started["name"], pull_id=(started.get("pull") or {}).get("id"), timeout=timeout, on_progress=on_progress)

    def list(self) -> List[Dict[str, Any]]:
        return self._client._call(core.Request("GET", "/v1/images"))["images"]

    def get(self, name: str) -> Dict[str, Any]:
        return self._client._call(core.Request("GET", image_path(name)))

    def delete(self, name: str) -> Dict[str, Any]:
        """Removes the record; its layers stay while sandboxes, snapshots or other images use them."""
        return self._client._call(core.Request("DELETE", image_path(name)))


class AsyncImages:
    def __init__(self, client: core.AsyncCaller):
        self._client = client

    async def import_archive(self, source: Source, *, name: str, platform: Optional[str] = None, ref: Optional[str] = None,
                             on_progress: Optional[Callable[[int], None]] = None) -> Dict[str, Any]:
        """As `Images.import_archive`, awaited (the file is read off the event loop)."""
        return await self._client._call(import_request(source, name, platform, ref, on_progress))

    async def pull(self, ref: str, *, name: Optional[str] = None, platform: Optional[str] = None) -> Dict[str, Any]:
        """As `Images.pull`, awaited."""
        return await self._client._call(pull_request(ref, name, platform))

    async def wait(self, name: str, *, pull_id: Optional[str] = None, timeout: Optional[float] = None,
                   on_progress: Optional[Callable[[Dict[str, Any]], None]] = None) -> Dict[str, Any]:
        """As `Images.wait`, awaited (the waits between reads sleep on the event loop)."""
        waiting = _PullWait(name, pull_id, timeout)
        while True:
            record = await self.get(name)
            if waiting.settled(record):
                return record
            if on_progress:
                on_progress(record)
            await asyncio.sleep(PULL_POLL_S)

    async def pull_and_wait(self, ref: str, *, name: Optional[str] = None, platform: Optional[str] = None, timeout: Optional[float] = None,
                            on_progress: Optional[Callable[[Dict[str, Any]], None]] = None) -> Dict[str, Any]:
        """As `Images.pull_and_wait`, awaited."""
        started = await self.pull(ref, name=name, platform=platform)
        return await self.wait(started["name"], pull_id=(started.get("pull") or {}).get("id"), timeout=timeout, on_progress=on_progress)

    async def list(self) -> List[Dict[str, Any]]:
        return (await self._client._call(core.Request("GET", "/v1/images")))["images"]

    async def get(self, name: str) -> Dict[str, Any]:
        return await self._client._call(core.Request("GET", image_path(name)))

    async def delete(self, name: str) -> Dict[str, Any]:
        return await self._client._call(core.Request("DELETE", image_path(name)))

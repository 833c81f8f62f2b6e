"""Images through both clients (`client.images`): OCI layouts built here, imported streamed, used by sandboxes."""
import asyncio
import gzip
import hashlib
import io
import json
import tarfile

import pytest

from rollbox import ImageNotFound, InvalidImage, NotFound
from rollbox.aio import AsyncRollbox


def layer(files):
    """An uncompressed layer tar of {path: text}."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(path)
            info.size = len(data)
            info.mode = 0o644
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def digest(data):
    return "sha256:" + hashlib.sha256(data).hexdigest()


def oci_layout(layers, config, leave_out=None):
    """An OCI image layout as a tar: gzip layer blobs, config, manifest, index.json."""
    blobs, descriptors = {}, []
    for i, tar in enumerate(layers):
        gz = gzip.compress(tar, mtime=0)
        descriptors.append({"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": digest(gz), "size": len(gz)})
        if i != leave_out:
            blobs[digest(gz)] = gz
    cfg = json.dumps({"architecture": "amd64", "os": "linux", "config": config, "rootfs": {"type": "layers", "diff_ids": [digest(t) for t in layers]}}).encode()
    manifest = json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                           "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": digest(cfg), "size": len(cfg)},
                           "layers": descriptors}).encode()
    blobs[digest(cfg)] = cfg
    blobs[digest(manifest)] = manifest
    index = json.dumps({"schemaVersion": 2, "manifests": [{"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": digest(manifest), "size": len(manifest)}]}).encode()
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in [*((f"blobs/sha256/{d[7:]}", b) for d, b in blobs.items()), ("index.json", index), ("oci-layout", b'{"imageLayoutVersion":"1.0.0"}')]:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


BASE = layer({"etc/motd": "from the python test\n", "srv/data.txt": "base\n"})


def test_import_streams_a_file_reuses_shared_layers_and_gives_sandboxes_its_defaults(client, tmp_path):
    archive = tmp_path / "image.tar"
    archive.write_bytes(oci_layout([BASE, layer({"srv/app.txt": "app one\n"})], {"Env": ["GREETING=hi from the image"], "WorkingDir": "/srv"}))
    seen = []
    image = client.images.import_archive(str(archive), name="py-one", on_progress=seen.append)
    assert image["name"] == "py-one" and len(image["layers"]) == 2
    assert image["import"]["layersBuilt"] == 2 and image["import"]["archiveBytes"] == archive.stat().st_size
    assert seen and seen[-1] == archive.stat().st_size and seen == sorted(seen)
    assert image["config"]["WorkingDir"] == "/srv"

    # The same base under another image: stored once, not built again. From a file object this time.
    with open(tmp_path / "two.tar", "wb") as f:
        f.write(oci_layout([BASE, layer({"srv/app.txt": "app two\n"})], {"Env": []}))
    with open(tmp_path / "two.tar", "rb") as f:
        two = client.images.import_archive(f, name="py-two")
    assert two["import"]["layersReused"] == 1 and two["layers"][0] == image["layers"][0]

    assert {"py-one", "py-two"} <= {i["name"] for i in client.images.list()}
    assert client.images.get("py-one")["layers"] == image["layers"]

    # The image has no shell of its own: the busybox layer on top brings one.
    sb = client.sandboxes.create(image={"base": "py-one", "layers": ["busybox"]}, resources={"memoryMiB": 64})
    try:
        r = sb.exec('echo "$GREETING"; pwd; cat app.txt /etc/motd')
        assert r.stdout == "hi from the image\n/srv\napp one\nfrom the python test\n"
    finally:
        sb.delete()

    client.images.delete("py-two")
    with pytest.raises(NotFound):
        client.images.get("py-two")


def test_a_malformed_archive_is_a_typed_error(client, tmp_path):
    bad = tmp_path / "bad.tar"
    bad.write_bytes(oci_layout([layer({"x": "missing\n"})], {}, leave_out=0))
    with pytest.raises(InvalidImage) as err:
        client.images.import_archive(str(bad), name="py-bad")
    assert "not in the archive" in str(err.value)
    with pytest.raises(NotFound):
        client.images.get("py-bad")


def test_the_async_client_imports_lists_and_deletes(stack, tmp_path):
    archive = tmp_path / "async.tar"
    archive.write_bytes(oci_layout([BASE, layer({"srv/async.txt": "async\n"})], {"User": "0"}))

    async def main():
        async with AsyncRollbox(stack["url"], stack["tokens"]["user"]) as client:
            seen = []
            image = await client.images.import_archive(archive, name="py-async", on_progress=seen.append)
            assert image["import"]["layersReused"] == 1 and image["config"]["User"] == "0"
            assert seen[-1] == archive.stat().st_size
            assert (await client.images.get("py-async"))["digest"] == image["digest"]
            assert "py-async" in {i["name"] for i in await client.images.list()}
            await client.images.delete("py-async")
            with pytest.raises(NotFound):
                await client.images.get("py-async")

    asyncio.run(main())


def push(stack, tmp_path, archive, repo_tag):
    """Puts an OCI layout into the stack's test registry, as an image is pushed (skopeo)."""
    import subprocess

    path = tmp_path / "push.tar"
    path.write_bytes(archive)
    subprocess.run(["skopeo", "copy", "--quiet", "--dest-tls-verify=false", f"oci-archive:{path}", f"docker://{stack['registry']}/{repo_tag}"], check=True, timeout=120)
    return f"{stack['registry']}/{repo_tag}"


def test_pull_from_a_registry_and_wait_until_ready(client, stack, tmp_path):
    ref = push(stack, tmp_path, oci_layout([BASE, layer({"srv/pulled.txt": "pulled\n"})], {"Env": ["FROM=registry"], "WorkingDir": "/srv"}), "py/pulled:1")
    started = client.images.pull(ref, name="py-pulled")
    assert started["name"] == "py-pulled" and started["pull"]["ref"] == ref
    seen = []
    image = client.images.wait("py-pulled", pull_id=started["pull"]["id"], on_progress=seen.append)
    assert image["state"] == "ready" and image["ref"] == ref and len(image["layers"]) == 2
    assert image["pull"]["progress"]["layersDone"] == 2 and all(r["pull"]["state"] == "pulling" for r in seen)

    # Pulled again: every layer is held, nothing fetched.
    again = client.images.pull_and_wait(ref, name="py-pulled")
    assert again["pull"]["id"] != started["pull"]["id"] and again["pull"]["progress"]["bytesFetched"] == 0

    sb = client.sandboxes.create(image={"ref": ref, "layers": ["busybox"]}, resources={"memoryMiB": 64})
    try:
        assert sb.exec('echo "$FROM"; cat pulled.txt').stdout == "registry\npulled\n"
    finally:
        sb.delete()

    with pytest.raises(ImageNotFound):
        client.images.pull_and_wait(f"{stack['registry']}/py/pulled:missing")
    with pytest.raises(ImageNotFound):
        client.sandboxes.create(image={"ref": f"{stack['registry']}/py/nothing:1"}, resources={"memoryMiB": 64})


def test_the_async_client_pulls_and_waits(stack, tmp_path):
    ref = push(stack, tmp_path, oci_layout([BASE, layer({"srv/apull.txt": "async pull\n"})], {}), "py/apulled:1")

    async def main():
        async with AsyncRollbox(stack["url"], stack["tokens"]["user"]) as client:
            image = await client.images.pull_and_wait(ref, name="py-apulled", timeout=120)
            assert image["state"] == "ready" and image["ref"] == ref
            assert (await client.images.get("py-apulled"))["layers"] == image["layers"]
            with pytest.raises(ImageNotFound):
                await client.images.pull_and_wait(f"{stack['registry']}/py/apulled:missing")
            await client.images.delete("py-apulled")

    asyncio.run(main())

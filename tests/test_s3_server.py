"""The S3 servers the tests and rehearsals use, checked against the behaviours the pipeline
relies on: PUT, GET, ranged GET, HEAD, listings paged past 1,000 keys in key order, multipart
uploads, copies and deletes, and a PUT whose connection is cut halfway leaving the old object
(or none), never a truncated one. Each runs on the disk-backed server (s3rver behind
tests/s3_server.js) and on moto's, both on 127.0.0.1 and stopped by PID.

Select with `pytest -m cluster`.
"""

from __future__ import annotations

import os
import socket
import time
import urllib.parse
from pathlib import Path

import pytest
from cluster_services import (
    AWS_ENVIRONMENT,
    BUCKET,
    S3_TESTS,
    Services,
    s3,
    s3_requests,
    start_moto,
    start_s3_server,
)

pytestmark = S3_TESTS

MULTIPART_CHUNK = 5 * 2**20  # S3's smallest part but the last


@pytest.fixture(scope="module", params=["s3rver", "moto"])
def server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    logs = tmp_path_factory.mktemp(f"{request.param}-logs")
    services = Services()
    try:
        if request.param == "s3rver":
            start_s3_server(services, logs)
        else:
            start_moto(services, logs)
        yield request.param, services
    finally:
        services.stop()


def test_put_get_ranged_get_head_copy_delete(server):
    _name, services = server
    fs = s3(services)
    key = f"{BUCKET}/basic/object.bin"
    content = os.urandom(70_000)
    fs.pipe_file(key, content)
    assert fs.cat_file(key) == content
    assert fs.cat_file(key, start=1000, end=1010) == content[1000:1010]
    assert fs.cat_file(key, start=69_990, end=80_000) == content[69_990:]  # past the end
    info = fs.info(key)
    assert info["size"] == len(content) and info["type"] == "file"
    # Names as the temporary files name their writer (`.partial-<pid>@<host>-...`).
    odd = f"{BUCKET}/basic/.partial-12@host-a+b,c:d e.bin"
    fs.pipe_file(odd, content)
    for source, copy in ((key, "copy.bin"), (odd, "copy of odd.bin")):
        fs.cp_file(source, f"{BUCKET}/basic/{copy}")
        assert fs.cat_file(f"{BUCKET}/basic/{copy}") == content
        fs.rm_file(f"{BUCKET}/basic/{copy}")
        assert not fs.exists(f"{BUCKET}/basic/{copy}")
    with pytest.raises(FileNotFoundError):
        fs.cat_file(f"{BUCKET}/basic/missing.bin")


def test_listings_page_past_1000_keys_in_key_order(server):
    """A folder of 1,100 keys beside keys that share its name's prefix (`a.npy`, `a-x`, `a`:
    the output layout's `images/<partition>/` beside `images/<partition>.npy`), so that key
    order and the order of names on disk differ where a page ends."""
    _name, services = server
    fs = s3(services)
    base = f"{BUCKET}/paged"
    inside = [f"{base}/a/{number:05d}.png" for number in range(1100)]
    beside = [f"{base}/a", f"{base}/a-x", f"{base}/a.npy", f"{base}/b"]
    fs.pipe({key: b"x" for key in inside + beside})
    found = fs.find(base)
    assert found == sorted(inside + beside)  # all of them, in key order, once each
    # One level, with the delimiter: the keys beside the folder and the folder once.
    listed = {(entry["name"], entry["type"]) for entry in fs.ls(base, detail=True)}
    assert listed == {(key, "file") for key in beside} | {(f"{base}/a", "directory")}


def test_multipart_upload_assembles_the_parts(server, tmp_path: Path):
    _name, services = server
    fs = s3(services)
    content = os.urandom(2 * MULTIPART_CHUNK + 12_345)
    local = tmp_path / "big.bin"
    local.write_bytes(content)
    fs.put_file(str(local), f"{BUCKET}/multipart/put.bin", chunksize=MULTIPART_CHUNK)
    with fs.open(f"{BUCKET}/multipart/stream.bin", "wb", block_size=MULTIPART_CHUNK) as handle:
        for start in range(0, len(content), 1_000_000):
            handle.write(content[start : start + 1_000_000])
    for key in ("put.bin", "stream.bin"):
        assert fs.cat_file(f"{BUCKET}/multipart/{key}") == content
    across = (MULTIPART_CHUNK - 5, MULTIPART_CHUNK + 5)  # a range across two parts
    assert (
        fs.cat_file(f"{BUCKET}/multipart/put.bin", start=across[0], end=across[1])
        == content[slice(*across)]
    )
    if server[0] == "s3rver":  # the parts were uploaded as parts, not as one PUT
        counted = s3_requests(services)["requests"]
        assert counted["MULTIPART_START"] >= 2 and counted["PART"] >= 5
        assert counted["MULTIPART_COMPLETE"] >= 2


def test_a_completion_naming_a_part_not_uploaded_changes_nothing(server):
    """InvalidPart for a part never uploaded or an ETag that is not the part's; the parts stay,
    and the completion that names them right then assembles the object."""
    _name, services = server
    fs = s3(services)
    key = "multipart/checked.bin"
    parts = [os.urandom(MULTIPART_CHUNK), os.urandom(1_000)]
    upload = fs.call_s3("create_multipart_upload", Bucket=BUCKET, Key=key)["UploadId"]
    etags = [
        fs.call_s3(
            "upload_part", Bucket=BUCKET, Key=key, UploadId=upload, PartNumber=number, Body=body
        )["ETag"]
        for number, body in enumerate(parts, start=1)
    ]
    listed = [{"PartNumber": number, "ETag": etag} for number, etag in enumerate(etags, start=1)]

    def complete(named: list[dict]) -> None:
        fs.call_s3(
            "complete_multipart_upload",
            Bucket=BUCKET,
            Key=key,
            UploadId=upload,
            MultipartUpload={"Parts": named},
        )

    wrong = [
        [*listed, {"PartNumber": 3, "ETag": etags[1]}],  # never uploaded
        [listed[0], {"PartNumber": 2, "ETag": etags[0]}],  # another part's ETag
    ]
    for named in wrong:
        with pytest.raises(OSError) as refused:  # s3fs's, the S3 error its cause
            complete(named)
        assert refused.value.__cause__.response["Error"]["Code"] == "InvalidPart"
        assert not fs.exists(f"{BUCKET}/{key}")
    complete(listed)
    assert fs.cat_file(f"{BUCKET}/{key}") == b"".join(parts)


@pytest.mark.parametrize("existing", [b"OLD" * 10_000, None], ids=["replaced", "new"])
def test_a_put_cut_halfway_leaves_the_old_object_or_none(server, existing):
    """The connection drops after half of the announced body: the server keeps what the key
    held (or nothing), never the half it received."""
    _name, services = server
    fs = s3(services)
    key = f"cut/{'replaced' if existing else 'new'}.bin"
    if existing is not None:
        fs.pipe_file(f"{BUCKET}/{key}", existing)
    body = os.urandom(200_000)
    _send_half_of_a_put(services, key, body)
    deadline = time.monotonic() + 2
    while time.monotonic() < deadline:  # the server notices the cut a moment later
        time.sleep(0.3)
        if existing is None:
            assert not fs.exists(f"{BUCKET}/{key}")
        else:
            assert fs.cat_file(f"{BUCKET}/{key}") == existing


# moto keeps no count of requests: the disk-backed server only.
@pytest.mark.parametrize("server", ["s3rver"], indirect=True)
def test_requests_are_counted_by_kind(server):
    _name, services = server
    fs = s3(services)
    before = s3_requests(services)
    fs.pipe_file(f"{BUCKET}/counted/one", b"12345")
    # One GET (s3fs asks the size first, a HEAD, unless told to read in one request).
    fs.cat_file(f"{BUCKET}/counted/one", max_concurrency=1)
    fs.cat_file(f"{BUCKET}/counted/one", start=0, end=2)
    moved = s3_requests(services)  # bodies: the PUT's 5 bytes in, the GETs' 5 + 2 out
    assert moved["bytes_in"] - before["bytes_in"] == 5
    assert moved["bytes_out"] - before["bytes_out"] == 5 + 2
    fs.info(f"{BUCKET}/counted/one")
    fs.find(f"{BUCKET}/counted")
    fs.rm_file(f"{BUCKET}/counted/one")
    after = s3_requests(services)
    counted = {
        kind: after["requests"].get(kind, 0) - before["requests"].get(kind, 0)
        for kind in after["requests"]
    }
    assert {kind: n for kind, n in counted.items() if n} == {
        "PUT": 1,
        "GET": 1,
        "GET_RANGE": 1,
        "HEAD": 1,
        "LIST": 1,
        "DELETE": 1,
    }


def _send_half_of_a_put(services: Services, key: str, body: bytes) -> None:
    """A signed PUT of `body` (a presigned URL), of which half is sent before the socket is
    closed."""
    import boto3

    client = boto3.client(
        "s3",
        endpoint_url=services.s3_endpoint,
        aws_access_key_id=AWS_ENVIRONMENT["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=AWS_ENVIRONMENT["AWS_SECRET_ACCESS_KEY"],
        region_name=AWS_ENVIRONMENT["AWS_DEFAULT_REGION"],
    )
    url = urllib.parse.urlsplit(
        client.generate_presigned_url("put_object", Params={"Bucket": BUCKET, "Key": key})
    )
    head = (
        f"PUT {url.path}?{url.query} HTTP/1.1\r\nHost: {url.netloc}\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    with socket.create_connection((url.hostname, url.port), timeout=10) as connection:
        connection.sendall(head.encode() + body[: len(body) // 2])
        time.sleep(0.2)

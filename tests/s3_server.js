#!/usr/bin/env node
// A disk-backed S3-compatible server for the tests and rehearsals: s3rver (npm, pinned in the
// repository's package.json, installed by `make s3-server`) with three of its gaps closed, and
// a count of the requests it served.
//
//   node --openssl-legacy-provider tests/s3_server.js --directory DIR --port PORT \
//        [--address 127.0.0.1] [--bucket NAME]... [--request-log FILE]
//
// `--openssl-legacy-provider`: s3rver encrypts ListObjectsV2 continuation tokens with DES,
// which Node's OpenSSL 3 only offers through its legacy provider; without it every listing
// past its first page of 1,000 keys fails with a 500.
//
// What s3rver 3.7.1 does differently from S3, and this launcher changes (tests/test_s3_server.py
// checks each against the real behaviour the pipeline relies on):
// 1. An upload is written straight into the object's file: a reader sees it half-written while
//    it streams in, and a connection cut halfway leaves the truncated body as the object. Here
//    the body goes to a temporary file, is checked against Content-Length, Content-MD5 and
//    x-amz-checksum-crc32 when the client sent them, and replaces the object by one rename:
//    a reader sees the old object or the new one (as on S3), and a short body is rejected.
//    Multipart parts likewise, and a completed upload is assembled without a second copy of
//    its parts on disk.
// 2. A listing walks the folders in file-name order, which is not key order where a "folder"
//    and a key share a prefix (`images/x/...` and `images/x.npy`): pages after the first then
//    skip keys. Here the walk yields keys in S3's order (UTF-8 bytes), so paging is exact.
// 3. Only the access key `S3RVER` is accepted; here also the one in AWS_ACCESS_KEY_ID (with
//    AWS_SECRET_ACCESS_KEY), so the same environment reaches moto or this server.
// 4. A copy's source (x-amz-copy-source, URL-encoded by the client) is decoded with decodeURI,
//    which leaves reserved characters encoded: a key holding `@`, `+`, `,` or `:` is not found.
//    Here the header is decoded whole first, as S3 decodes it.
//
// `GET /-/stats` (no bucket can be named `-`) answers the requests served so far as JSON: by
// kind (GET, GET_RANGE, HEAD, PUT, LIST, COPY, DELETE, PART, MULTIPART_START, ...), by status
// class, and the body bytes received and sent. `--request-log FILE` also appends one line per
// request: kind, status, bytes in, bytes out, path.
'use strict';

const crypto = require('crypto');
const fs = require('fs');
const path = require('path');
const { Transform } = require('stream');
const { pipeline } = require('stream/promises');
const zlib = require('zlib');

const S3rver = require('s3rver');
const FilesystemStore = require('s3rver/lib/stores/filesystem');
const S3Object = require('s3rver/lib/models/object');
const S3Error = require('s3rver/lib/models/error');
const { DUMMY_ACCOUNT } = require('s3rver/lib/models/account');

const OBJECT_SUFFIX = '._S3rver_object';
// s3rver's own folders (multipart uploads in progress) carry this marker; they hold no keys.
const STORE_MARKER = '._S3rver_';

function parseArguments(argv) {
  const options = { address: '127.0.0.1', port: 0, buckets: [], requestLog: null };
  for (let index = 0; index < argv.length; index += 2) {
    const [name, value] = [argv[index], argv[index + 1]];
    if (value === undefined) throw new Error(`${name} needs a value`);
    if (name === '--directory') options.directory = value;
    else if (name === '--address') options.address = value;
    else if (name === '--port') options.port = Number(value);
    else if (name === '--bucket') options.buckets.push(value);
    else if (name === '--request-log') options.requestLog = value;
    else throw new Error(`unknown option ${name}`);
  }
  if (!options.directory) throw new Error('--directory is required');
  return options;
}

// --- 1. uploads: a temporary file, checked, then renamed over the object ------------------

function temporaryName(target) {
  // Ends in neither the object suffix nor `.md5`: a listing never shows it.
  return `${target}.${process.pid}-${crypto.randomBytes(8).toString('hex')}.upload`;
}

// A stream stage that hands each chunk to `see` (a digest, a count) and passes it on unchanged.
function passingThrough(see) {
  return new Transform({
    transform(chunk, _encoding, callback) {
      see(chunk);
      callback(null, chunk);
    },
  });
}

// The body streamed into `file`, with its size, MD5 and SHA-256 (hex) and CRC32; the stream's
// end before the announced length (a cut connection) rejects.
async function receive(content, file) {
  const md5 = crypto.createHash('md5');
  const sha256 = crypto.createHash('sha256');
  let crc = 0;
  let size = 0;
  const withCrc = typeof zlib.crc32 === 'function';
  if (Buffer.isBuffer(content)) {
    await fs.promises.writeFile(file, content);
    md5.update(content);
    sha256.update(content);
    crc = withCrc ? zlib.crc32(content) : 0;
    size = content.length;
  } else {
    const measure = passingThrough(chunk => {
      md5.update(chunk);
      sha256.update(chunk);
      if (withCrc) crc = zlib.crc32(chunk, crc);
      size += chunk.length;
    });
    await pipeline(content, measure, fs.createWriteStream(file));
  }
  return {
    size,
    md5: md5.digest('hex'),
    sha256: sha256.digest('hex'),
    crc: withCrc ? crc : null,
  };
}

// Rejects a body that is not what the request announced, as S3 does.
function checkBody(content, received) {
  const headers = content && content.headers;
  if (!headers) return; // assembled parts or an internal copy: checked when they arrived
  const declared = headers['x-amz-decoded-content-length'] || headers['content-length'];
  if (declared !== undefined && Number(declared) !== received.size) {
    throw new S3Error(
      'IncompleteBody',
      'You did not provide the number of bytes specified by the Content-Length HTTP header.',
    );
  }
  // The signed payload hash, unless the client signed none (UNSIGNED-PAYLOAD, STREAMING-...).
  const payloadHash = headers['x-amz-content-sha256'];
  if (payloadHash && /^[0-9a-f]{64}$/.test(payloadHash) && payloadHash !== received.sha256) {
    const error = new S3Error(
      'XAmzContentSHA256Mismatch',
      "The provided 'x-amz-content-sha256' header does not match what was computed.",
    );
    error.status = 400; // S3's status; s3rver knows no such code and would answer 500
    error.expose = true;
    throw error;
  }
  const md5 = headers['content-md5'];
  if (md5 && Buffer.from(md5, 'base64').toString('hex') !== received.md5) {
    throw new S3Error('BadDigest', 'The Content-MD5 you specified did not match what was received.');
  }
  const crc32 = headers['x-amz-checksum-crc32'];
  if (crc32 && received.crc !== null) {
    const sent = Buffer.from(crc32, 'base64');
    if (sent.length !== 4 || sent.readUInt32BE(0) !== received.crc) {
      throw new S3Error('BadDigest', 'The CRC32 you specified did not match the calculated checksum.');
    }
  }
}

// Receive `content` into a temporary sibling of `target`, check it, and rename it into place.
async function receiveInto(content, target) {
  await fs.promises.mkdir(path.dirname(target), { recursive: true });
  const temp = temporaryName(target);
  try {
    const received = await receive(content, temp);
    checkBody(content, received);
    await fs.promises.rename(temp, target);
    return received;
  } catch (error) {
    await fs.promises.rm(temp, { force: true });
    throw error;
  }
}

FilesystemStore.prototype.putObject = async function putObject(object) {
  const target = this.getResourcePath(object.bucket, object.key, 'object');
  const { size, md5 } = await receiveInto(object.content, target);
  // The bytes changed at once (the rename); the ETag and metadata follow right after.
  await this.putMetadata(object.bucket, object.key, object.metadata, md5);
  return { size, md5 };
};

FilesystemStore.prototype.putPart = async function putPart(bucket, uploadId, partNumber, content) {
  const uploads = this.getResourcePath(bucket, undefined, 'uploads');
  const target = path.join(uploads, uploadId, partNumber.toString());
  const { size, md5 } = await receiveInto(content, target);
  await fs.promises.writeFile(`${target}.md5`, md5);
  return { size, md5 };
};

// A completed multipart upload is assembled part by part into the temporary file, each part
// removed once appended: s3rver reads every part into a new object and removes the parts only
// at the end, so a 12 GB array briefly takes 24 GB of disk; here it takes its size and one
// part. Every listed part is checked (it exists, its ETag is the one given) before any is
// consumed, so a wrong completion changes nothing (InvalidPart, as S3 answers; s3rver's is a
// 500). A completion that fails once parts are consumed (a full disk) removes the upload: the
// client uploads again, as after an abort.
FilesystemStore.prototype.putObjectMultipart = async function putObjectMultipart(
  bucket,
  uploadId,
  parts,
) {
  const uploadDir = path.join(this.getResourcePath(bucket, undefined, 'uploads'), uploadId);
  const ordered = [...parts].sort((left, right) => left.number - right.number);
  const files = ordered.map(part => path.join(uploadDir, part.number.toString()));
  await Promise.all(
    ordered.map(async (part, index) => {
      const md5 = await fs.promises.readFile(`${files[index]}.md5`, 'utf8').catch(() => null);
      if (md5 === null || md5 !== part.etag) {
        throw new S3Error(
          'InvalidPart',
          'One or more of the specified parts could not be found. The part may not have been ' +
            "uploaded, or the specified entity tag may not match the part's entity tag.",
        );
      }
    }),
  );
  const [key, metadata] = await Promise.all([
    fs.promises.readFile(path.join(uploadDir, 'key'), 'utf8'),
    fs.promises.readFile(path.join(uploadDir, 'metadata'), 'utf8').then(JSON.parse),
  ]);
  const target = this.getResourcePath(bucket, key, 'object');
  await fs.promises.mkdir(path.dirname(target), { recursive: true });
  const temp = temporaryName(target);
  const md5 = crypto.createHash('md5');
  let size = 0;
  try {
    for (const file of files) {
      const measure = passingThrough(chunk => {
        md5.update(chunk);
        size += chunk.length;
      });
      await pipeline(fs.createReadStream(file), measure, fs.createWriteStream(temp, { flags: 'a' }));
      await fs.promises.rm(file);
    }
    await fs.promises.rename(temp, target);
  } catch (error) {
    await fs.promises.rm(temp, { force: true });
    await fs.promises.rm(uploadDir, { recursive: true, force: true });
    throw error;
  }
  const digest = md5.digest('hex');
  await this.putMetadata(bucket, key, metadata, digest);
  await fs.promises.rm(uploadDir, { recursive: true, force: true });
  return { size, md5: digest };
};

// --- 2. listings in key order ---------------------------------------------------------------

function compareKeys(left, right) {
  return Buffer.compare(Buffer.from(left, 'utf8'), Buffer.from(right, 'utf8'));
}

// Keys below `folder` (whose keys start with `base`) in S3's order. A folder sorts as its name
// and `/`: every key inside it starts so, and no key beside it contains a `/`. With the
// delimiter `/`, a folder that is one common prefix whole is yielded as that prefix (ending in
// `/`) rather than walked: a listing of `images/` does not read every image's file.
function* keysInOrder(folder, base, prefix, startAfter, delimiter) {
  let entries;
  try {
    entries = fs.readdirSync(folder, { withFileTypes: true });
  } catch (error) {
    if (error.code === 'ENOENT' || error.code === 'ENOTDIR') return;
    throw error;
  }
  const items = [];
  for (const entry of entries) {
    if (entry.isDirectory()) {
      if (!entry.name.includes(STORE_MARKER)) {
        items.push({ key: `${base}${entry.name}/`, name: entry.name, folder: true });
      }
    } else if (entry.name.endsWith(OBJECT_SUFFIX)) {
      items.push({ key: base + entry.name.slice(0, -OBJECT_SUFFIX.length), folder: false });
    }
  }
  items.sort((left, right) => compareKeys(left.key, right.key));
  for (const item of items) {
    if (!item.folder) {
      yield item.key;
      continue;
    }
    const inside = item.key;
    if (!inside.startsWith(prefix) && !prefix.startsWith(inside)) continue; // off the prefix
    if (startAfter && compareKeys(inside, startAfter) < 0 && !startAfter.startsWith(inside)) {
      continue; // every key inside sorts before startAfter
    }
    if (delimiter === '/' && inside.startsWith(prefix)) {
      yield inside;
      continue;
    }
    yield* keysInOrder(path.join(folder, item.name), inside, prefix, startAfter, delimiter);
  }
}

FilesystemStore.prototype.listObjects = async function listObjects(bucket, options) {
  const { delimiter = '', startAfter = '', prefix = '', maxKeys = Infinity } = options;
  const keys = [];
  const commonPrefixes = [];
  let isTruncated = false;
  const bucketPath = this.getBucketPath(bucket);
  for (const key of keysInOrder(bucketPath, '', prefix, startAfter, delimiter)) {
    if (!key.startsWith(prefix) || (startAfter && compareKeys(key, startAfter) <= 0)) continue;
    const rest = key.slice(prefix.length);
    const at = delimiter ? rest.indexOf(delimiter) : -1;
    if (at !== -1) {
      const common = key.slice(0, prefix.length + at + delimiter.length);
      if (commonPrefixes[commonPrefixes.length - 1] !== common) commonPrefixes.push(common);
      continue;
    }
    if (keys.length === maxKeys) {
      isTruncated = true;
      break;
    }
    keys.push(key);
  }
  // The next page starts after this page's last key: a common prefix after it is that page's.
  const last = keys[keys.length - 1];
  const shown = isTruncated
    ? commonPrefixes.filter(common => compareKeys(common, last) < 0)
    : commonPrefixes;
  const metadata = await Promise.all(
    keys.map(key =>
      this.getMetadata(bucket, key).catch(error => {
        if (error.code === 'ENOENT') return undefined; // removed while listing
        throw error;
      }),
    ),
  );
  return {
    objects: keys
      .map((key, index) => [key, metadata[index]])
      .filter(([, found]) => found !== undefined)
      .map(([key, found]) => new S3Object(bucket, key, null, found)),
    commonPrefixes: shown,
    isTruncated,
  };
};

// --- 4. copy sources decoded whole ---------------------------------------------------------

function decodeCopySource(ctx, next) {
  const source = ctx.headers['x-amz-copy-source'];
  if (source) {
    const [name, version] = source.split('?');
    // s3rver applies decodeURI next: encodeURI's output is what it turns back into the key.
    const decoded = encodeURI(decodeURIComponent(name));
    ctx.headers['x-amz-copy-source'] = version === undefined ? decoded : `${decoded}?${version}`;
  }
  return next();
}

// --- counting ------------------------------------------------------------------------------

function requestKind(method, url, headers) {
  const [pathname, query = ''] = url.split('?');
  const parameters = new URLSearchParams(query);
  const segments = pathname.split('/').filter(Boolean);
  const onKey = segments.length > 1;
  if (method === 'GET' && !onKey) return segments.length ? 'LIST' : 'LIST_BUCKETS';
  if (method === 'GET') return headers.range ? 'GET_RANGE' : 'GET';
  if (method === 'HEAD') return onKey ? 'HEAD' : 'HEAD_BUCKET';
  if (method === 'PUT' && !onKey) return 'CREATE_BUCKET';
  if (method === 'PUT' && parameters.has('partNumber')) {
    return headers['x-amz-copy-source'] ? 'PART_COPY' : 'PART';
  }
  if (method === 'PUT') return headers['x-amz-copy-source'] ? 'COPY' : 'PUT';
  if (method === 'POST' && parameters.has('uploads')) return 'MULTIPART_START';
  if (method === 'POST' && parameters.has('uploadId')) return 'MULTIPART_COMPLETE';
  if (method === 'POST' && parameters.has('delete')) return 'DELETE_MANY';
  if (method === 'DELETE' && parameters.has('uploadId')) return 'MULTIPART_ABORT';
  if (method === 'DELETE') return onKey ? 'DELETE' : 'DELETE_BUCKET';
  return `${method}_OTHER`;
}

function counter(requestLog) {
  const stats = { requests: {}, status: {}, bytes_in: 0, bytes_out: 0 };
  // Written at once (no buffer): a request's line is in the file before its answer is sent.
  const log = requestLog ? fs.openSync(requestLog, 'a') : null;
  const count = async (ctx, next) => {
    if (ctx.method === 'GET' && ctx.path === '/-/stats') {
      ctx.type = 'application/json';
      ctx.body = JSON.stringify(stats);
      return;
    }
    const kind = requestKind(ctx.method, ctx.url, ctx.headers);
    const bytesIn = Number(ctx.headers['content-length'] || 0);
    let status;
    try {
      await next();
      status = ctx.status;
    } catch (error) {
      status = error.status || 500; // answered by s3rver's error handler after this
      throw error;
    } finally {
      const bytesOut = ctx.method === 'HEAD' ? 0 : Number(ctx.response.length || 0);
      const statusClass = `${String(status)[0]}xx`;
      stats.requests[kind] = (stats.requests[kind] || 0) + 1;
      stats.status[statusClass] = (stats.status[statusClass] || 0) + 1;
      stats.bytes_in += bytesIn;
      stats.bytes_out += bytesOut;
      if (log !== null) {
        fs.writeSync(log, `${kind} ${status} ${bytesIn} ${bytesOut} ${ctx.path}\n`);
      }
    }
  };
  return count;
}

async function main() {
  const options = parseArguments(process.argv.slice(2));
  fs.mkdirSync(options.directory, { recursive: true });
  const { AWS_ACCESS_KEY_ID: key, AWS_SECRET_ACCESS_KEY: secret } = process.env;
  if (key && secret) DUMMY_ACCOUNT.createKeyPair(key, secret);
  const server = new S3rver({
    directory: options.directory,
    address: options.address,
    port: options.port,
    silent: true,
    configureBuckets: options.buckets.map(name => ({ name, configs: [] })),
  });
  // First in the chain: every request is counted, whatever answers it.
  server.middleware.unshift(counter(options.requestLog), decodeCopySource);
  const { address, port } = await server.run();
  process.stdout.write(`s3_server listening on ${address}:${port}\n`);
  // At once, as a crash would: an upload in flight stays in its temporary file, never listed.
  const stop = () => process.exit(0);
  process.on('SIGINT', stop);
  process.on('SIGTERM', stop);
}

main().catch(error => {
  process.stderr.write(`${error.stack || error}\n`);
  process.exit(1);
});

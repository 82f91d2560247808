// The worker that owns the model: it loads the wasm engine, reads the GGUF by byte ranges
// (HTTP Range requests through a persistent Cache API store, or slices of a File), turns
// images into what the engine takes, and runs generation off the page's thread. It speaks
// the message protocol of wgemma.js.
import init, { WasmModel, setKnobs } from "./pkg/wgemma.js";

// Bytes per cached piece of a remote file: large enough that a 244 MB model takes a few dozen
// requests, small enough that a failed request costs little to redo.
const CHUNK = 8 << 20;
const CACHE_NAME = "wgemma-models-v1";
const RETRIES = 3;

let model = null;
const sessions = new Map();
// The generations under way, by session: whether an abort came for each.
const running = new Map();
const stats = { fetchedBytes: 0, cachedBytes: 0 };

class SourceError extends Error {
  constructor(message) {
    super(message);
    this.code = "source";
  }
}

async function fetchRange(url, start, end) {
  let last;
  for (let attempt = 0; attempt < RETRIES; attempt++) {
    try {
      const res = await fetch(url, { headers: { Range: `bytes=${start}-${end - 1}` } });
      if (res.status !== 206) {
        await res.body?.cancel();
        // 4xx/5xx will not get better; a 200 means the server ignores Range.
        throw new SourceError(
          res.status === 200
            ? `${url}: the server does not support HTTP Range requests`
            : `${url}: HTTP ${res.status} ${res.statusText}`.trim(),
        );
      }
      const bytes = new Uint8Array(await res.arrayBuffer());
      if (bytes.length !== end - start) {
        throw new Error(`${url}: got ${bytes.length} bytes of ${end - start} at ${start}`);
      }
      return bytes;
    } catch (e) {
      if (e instanceof SourceError) throw e;
      last = e;
      await new Promise((r) => setTimeout(r, 250 * 2 ** attempt));
    }
  }
  throw new SourceError(`${url}: download failed after ${RETRIES} tries: ${last?.message ?? last}`);
}

// The file's size and a validator (ETag / Last-Modified), so a changed file never reuses
// chunks cached for the old one.
async function probe(url) {
  let res;
  try {
    res = await fetch(url, { headers: { Range: "bytes=0-0" } });
  } catch (e) {
    throw new SourceError(`${url}: ${e.message}`);
  }
  await res.body?.cancel();
  if (res.status !== 206) {
    throw new SourceError(
      res.ok
        ? `${url}: the server does not support HTTP Range requests`
        : `${url}: HTTP ${res.status} ${res.statusText}`.trim(),
    );
  }
  const size = Number((res.headers.get("Content-Range") ?? "").split("/")[1]);
  if (!Number.isSafeInteger(size)) throw new SourceError(`${url}: no file size in Content-Range`);
  const validator = res.headers.get("ETag") ?? res.headers.get("Last-Modified") ?? "";
  return { size, validator };
}

async function openCache(enabled) {
  if (!enabled || typeof caches === "undefined") return null;
  try {
    return await caches.open(CACHE_NAME);
  } catch {
    return null; // storage blocked (private mode, quota): work without a cache
  }
}

async function httpReader(url, useCache) {
  url = new URL(url, self.location.href).href;
  const { size, validator } = await probe(url);
  const cache = await openCache(useCache);
  const key = (i) =>
    `${url}${url.includes("?") ? "&" : "?"}wgemma-chunk=${i}&size=${size}&v=${encodeURIComponent(validator)}`;
  // The chunk the previous read ended in: tiles rarely end on a chunk boundary.
  let recent = { index: -1, bytes: null };
  async function chunk(i) {
    if (recent.index === i) return recent.bytes;
    const start = i * CHUNK;
    const end = Math.min(size, start + CHUNK);
    let bytes = null;
    const hit = cache && (await cache.match(key(i)));
    if (hit) {
      const b = new Uint8Array(await hit.arrayBuffer());
      // A short entry cannot be written by us, but never trust one.
      if (b.length === end - start) {
        bytes = b;
        stats.cachedBytes += b.length;
      }
    }
    if (!bytes) {
      bytes = await fetchRange(url, start, end);
      stats.fetchedBytes += bytes.length;
      // Only whole, verified chunks are stored, so an interrupted download leaves no corrupt
      // entry and the next visit resumes from the chunks it has.
      if (cache) await cache.put(key(i), new Response(bytes)).catch(() => {});
    }
    recent = { index: i, bytes };
    return bytes;
  }
  return {
    size,
    async read(offset, length) {
      const out = new Uint8Array(length);
      let done = 0;
      while (done < length) {
        const pos = offset + done;
        const i = Math.floor(pos / CHUNK);
        const b = await chunk(i);
        const from = pos - i * CHUNK;
        const n = Math.min(length - done, b.length - from);
        out.set(b.subarray(from, from + n), done);
        done += n;
      }
      return out;
    },
  };
}

function blobReader(blob) {
  return {
    size: blob.size,
    async read(offset, length) {
      try {
        return new Uint8Array(await blob.slice(offset, offset + length).arrayBuffer());
      } catch (e) {
        throw new SourceError(`reading the file: ${e.message}`);
      }
    },
  };
}

async function reader(source, cache) {
  return typeof source === "string" ? await httpReader(source, cache !== false) : blobReader(source);
}

// The bytes of a URL (fetched here) or of a Blob; `what` names it in errors.
async function bytesOf(url, blob, what) {
  if (url !== undefined) {
    let res;
    try {
      res = await fetch(url);
    } catch (e) {
      throw new SourceError(`${url}: ${e.message}`);
    }
    if (!res.ok) throw new SourceError(`${url}: HTTP ${res.status} ${res.statusText}`.trim());
    return new Uint8Array(await res.arrayBuffer());
  }
  try {
    return new Uint8Array(await blob.arrayBuffer());
  } catch (e) {
    throw new SourceError(`reading the ${what}: ${e.message}`);
  }
}

// One image of wgemma.js's `wireImage` as the engine takes it: a file's bytes, or RGBA pixels.
async function engineImage({ url, blob, bytes, bitmap, pixels, width, height, imageTokens }) {
  if (url !== undefined || blob !== undefined) {
    bytes = await bytesOf(url, blob, "image");
  } else if (bitmap !== undefined) {
    ({ width, height } = bitmap);
    if (!width || !height) throw { code: "bad_image", message: "the ImageBitmap is empty or closed" };
    const canvas = new OffscreenCanvas(width, height);
    const context = canvas.getContext("2d", { willReadFrequently: true });
    context.drawImage(bitmap, 0, 0);
    pixels = context.getImageData(0, 0, width, height).data;
  }
  if (bytes !== undefined) return { bytes, imageTokens };
  return { pixels: new Uint8Array(pixels.buffer, pixels.byteOffset, pixels.byteLength), width, height, imageTokens };
}

// One clip of wgemma.js's `wireAudio` as the engine takes it: a file's bytes, or PCM samples.
async function engineAudio({ url, blob, bytes, samples, sampleRate, channels }) {
  if (url !== undefined || blob !== undefined) return { bytes: await bytesOf(url, blob, "audio") };
  if (bytes !== undefined) return { bytes };
  return { samples, sampleRate, channels };
}

// A reply whose buffers move to the page instead of being copied.
class Transferred {
  constructor(value, transfer) {
    this.value = value;
    this.transfer = transfer;
  }
}

// Errors cross postMessage as plain {code, message}.
function plain(e) {
  if (e && typeof e === "object" && typeof e.code === "string") {
    return { code: e.code, message: String(e.message) };
  }
  return { code: "internal", message: String(e?.message ?? e) };
}

const wasmReady = init();

// WebGPU on the CPU (SwiftShader, or a fallback adapter): the engine tunes its kernels for
// that, but the adapter only tells the page.
async function cpuAdapter() {
  const adapter = await navigator.gpu?.requestAdapter();
  const info = adapter?.info ?? {};
  return Boolean(
    adapter?.isFallbackAdapter ||
      info.isFallbackAdapter ||
      /swiftshader|llvmpipe|lavapipe/i.test(`${info.architecture} ${info.device} ${info.description}`),
  );
}

const handlers = {
  async load({ source, mmproj, cache, tableOnGpu, knobs }, reply) {
    await wasmReady;
    if (model) throw { code: "busy", message: "this worker already holds a model" };
    if (knobs) setKnobs(JSON.stringify(knobs));
    if (!navigator.gpu) {
      throw {
        code: "no_webgpu",
        message:
          "this browser has no WebGPU: use a recent Chrome or Edge (113 or later), or a browser with WebGPU turned on",
      };
    }
    const t0 = performance.now();
    model = await WasmModel.load(
      await reader(source, cache),
      mmproj == null ? null : await reader(mmproj, cache),
      (done, total) => reply({ progress: { loaded: done, total } }),
      await cpuAdapter(),
      Boolean(tableOnGpu),
    );
    const info = model.info();
    info.load = { ms: performance.now() - t0, ...stats };
    return info;
  },
  async session({ session, options }) {
    if (!model) throw { code: "no_model", message: "no model is loaded" };
    sessions.set(session, model.session(options ? JSON.stringify(options) : ""));
    return null;
  },
  async encodeImage({ image }) {
    if (!model) throw { code: "no_model", message: "no model is loaded" };
    const out = await model.encodeImage(await engineImage(image));
    return new Transferred(out, [out.data.buffer]);
  },
  async encodeAudio({ audio }) {
    if (!model) throw { code: "no_model", message: "no model is loaded" };
    const out = await model.encodeAudio(await engineAudio(audio));
    return new Transferred(out, [out.data.buffer]);
  },
  async generate({ session, request, images, audio }, reply) {
    const s = sessions.get(session);
    if (!s) throw { code: "no_session", message: `no session ${session}` };
    const state = { aborted: false };
    running.set(session, state);
    try {
      const engineImages = await Promise.all((images ?? []).map(engineImage));
      const engineClips = await Promise.all((audio ?? []).map(engineAudio));
      const done = s.generate(JSON.stringify(request), engineImages, engineClips, (event) => reply({ event }));
      // The engine forgets an abort that came before the generation started (a stale one
      // must not cut the next generation short); one that came while the images and clips
      // were read belongs to this generation.
      if (state.aborted) s.cancel();
      await done;
    } finally {
      running.delete(session);
    }
    return null;
  },
  async profile({ session, request, images, audio }) {
    const s = sessions.get(session);
    if (!s) throw { code: "no_session", message: `no session ${session}` };
    const engineImages = await Promise.all((images ?? []).map(engineImage));
    const engineClips = await Promise.all((audio ?? []).map(engineAudio));
    return await s.profile(JSON.stringify(request), engineImages, engineClips);
  },
  async reset({ session }) {
    await sessions.get(session)?.reset();
    return null;
  },
  async abort({ session }) {
    // Only a running generation is stopped: a late abort must not cut the next one short.
    const state = running.get(session);
    if (state) {
      state.aborted = true;
      sessions.get(session)?.cancel();
    }
    return null;
  },
  async closeSession({ session }) {
    sessions.get(session)?.free();
    sessions.delete(session);
    return null;
  },
};

self.onmessage = async ({ data }) => {
  const { id, op } = data;
  const reply = (msg, transfer = []) => self.postMessage({ id, ...msg }, transfer);
  try {
    const handler = handlers[op];
    if (!handler) throw { code: "bad_request", message: `unknown operation ${op}` };
    const out = await handler(data, reply);
    if (out instanceof Transferred) reply({ ok: out.value }, out.transfer);
    else reply({ ok: out });
  } catch (e) {
    reply({ error: plain(e) });
  }
};

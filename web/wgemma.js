// wgemma in the browser: the page-side API. The model lives in a Web Worker (worker.js) that
// runs the wasm engine on WebGPU, so the page stays responsive while weights load and tokens
// are generated.
//
//   const model = await WGemma.load(url or File, { onProgress });
//   const s = model.session({ context: 2048 });
//   for await (const ev of s.generate([{ role: "user", content: "Hi" }], { maxTokens: 64 }))
//     if (ev.type === "token") out.textContent += ev.text;
//   s.abort();   // from elsewhere: the generation ends within one step
//
// Images (Gemma 4 with a vision tower: a llama.cpp projector file passed as `mmproj`, or a
// model file that holds the tower):
//
//   const model = await WGemma.load(modelUrl, { mmproj: mmprojUrl or File, onProgress });
//   s.generate([{ role: "user", content: "What is this?", images: [file] }])  // images open the turn
//   s.generate([{ role: "user", content: [{ type: "text", text: "Is " }, { type: "image", image: a },
//                { type: "text", text: " like " }, { type: "image", image: b }, "?"] }])  // in place
//   s.generate("What is this?", { images: [file], imageTokens: 560 })  // one user turn
//   const { data, rows, width } = await model.encodeImage(file)  // the soft tokens, Float32Array
//
// An image is a File or Blob, an ArrayBuffer or Uint8Array (a PNG, JPEG, WebP or GIF file's
// bytes), a URL string (fetched by the worker), an ImageBitmap, ImageData, a canvas, an <img>
// or a video frame; or `{ image, imageTokens }` to give that one its own budget. Files, bytes
// and URLs are decoded by the engine exactly as natively; bitmaps, canvases and elements are
// drawn to RGBA pixels (what the browser decoded). `imageTokens` (70, 140, 280 by default,
// 560, 1120) is the most soft tokens an image becomes: more is finer detail and slower.
// Keep sending the whole conversation, its images included: the session keeps the turns it
// has seen in its KV cache and encodes only the images that are new.
//
// Audio (Gemma 4 E2B/E4B with an audio tower, from the projector file or the model file),
// up to 10 minutes a clip, 25 soft tokens a second, clips over 30 s in 30 s chunks:
//
//   s.generate([{ role: "user", content: "Transcribe this.", audio: [file] }])  // clips open the turn
//   s.generate([{ role: "user", content: [{ type: "audio", audio: buffer }, "Who speaks?"] }])
//   s.generate("What is this sound?", { audio: [file] })
//   const { data, rows, width } = await model.encodeAudio(file)
//
// A clip is a File or Blob, an ArrayBuffer or Uint8Array (a WAV, FLAC, MP3 or Ogg/Vorbis
// file's bytes, decoded by the engine as natively), a URL string, an AudioBuffer (what the
// browser decoded or recorded: `audioContext.decodeAudioData` turns a MediaRecorder's WebM or
// an AAC file into one), `{ samples: Float32Array, sampleRate, channels }` (interleaved), or
// OpenAI's `{ type: "input_audio", input_audio: { data: base64, format } }` part.

/** Every rejection of this API: `code` says what kind of failure, `message` the details. */
export class WGemmaError extends Error {
  constructor(code, message) {
    super(message);
    this.name = "WGemmaError";
    this.code = code;
  }
}

// One request/reply channel over the worker; replies carry the request id.
class Channel {
  constructor(worker) {
    this.worker = worker;
    this.next = 1;
    this.pending = new Map();
    worker.onmessage = ({ data }) => {
      const p = this.pending.get(data.id);
      if (!p) return;
      if ("ok" in data || "error" in data) {
        this.pending.delete(data.id);
        if (data.error) p.reject(new WGemmaError(data.error.code, data.error.message));
        else p.resolve(data.ok);
      } else {
        p.onMessage?.(data);
      }
    };
    worker.onerror = (e) => this.failAll(new WGemmaError("worker", e.message || "the worker failed"));
  }

  call(message, onMessage, transfer = []) {
    const id = this.next++;
    return new Promise((resolve, reject) => {
      this.pending.set(id, { resolve, reject, onMessage });
      this.worker.postMessage({ ...message, id }, transfer);
    });
  }

  send(message) {
    this.worker.postMessage({ ...message, id: 0 });
  }

  failAll(error) {
    for (const p of this.pending.values()) p.reject(error);
    this.pending.clear();
  }
}

let nextSession = 1;

const badRequest = (message) => new WGemmaError("bad_request", message);

// Things the browser draws (an ImageBitmap is made of each); those a page lacks are skipped.
const DRAWABLES = ["HTMLImageElement", "HTMLCanvasElement", "OffscreenCanvas", "HTMLVideoElement", "SVGImageElement", "VideoFrame"]
  .map((name) => globalThis[name])
  .filter(Boolean);

const copyOf = (view) => new Uint8Array(view.buffer.slice(view.byteOffset, view.byteOffset + view.byteLength));

// One image as the worker takes it (see worker.js's `engineImage`), and what to transfer with
// it. The caller's own buffers and bitmaps are cloned, never transferred: the next turn sends
// them again. Blobs and bitmaps cross by reference, and files are read in the worker.
async function wireImage(item, imageTokens) {
  let image = item;
  if (item && typeof item === "object" && "image" in item && !(item instanceof Blob)) {
    image = item.image;
    imageTokens = item.imageTokens ?? imageTokens;
  }
  const out = (wire, transfer = []) => ({ wire: { ...wire, imageTokens }, transfer });
  if (typeof image === "string") return out({ url: new URL(image, globalThis.location?.href).href });
  if (image instanceof Blob) return out({ blob: image });
  if (image instanceof ArrayBuffer) return out({ bytes: new Uint8Array(image) });
  if (ArrayBuffer.isView(image)) {
    const bytes = copyOf(image);
    return out({ bytes }, [bytes.buffer]);
  }
  if (typeof ImageData !== "undefined" && image instanceof ImageData) {
    return out({ pixels: image.data, width: image.width, height: image.height });
  }
  if (typeof ImageBitmap !== "undefined" && image instanceof ImageBitmap) return out({ bitmap: image });
  if (DRAWABLES.some((type) => image instanceof type)) {
    const bitmap = await createImageBitmap(image);
    return out({ bitmap }, [bitmap]);
  }
  throw badRequest(
    "an image must be a File, Blob, ArrayBuffer, Uint8Array, URL string, ImageBitmap, ImageData, canvas, <img> or video frame",
  );
}

// Interleaved samples of an AudioBuffer's channels.
function interleaved(buffer) {
  const { length, numberOfChannels: channels } = buffer;
  const samples = new Float32Array(length * channels);
  for (let c = 0; c < channels; c++) {
    const data = buffer.getChannelData(c);
    for (let i = 0; i < length; i++) samples[i * channels + c] = data[i];
  }
  return samples;
}

// One audio clip as the worker takes it (see worker.js's `engineAudio`), and what to transfer
// with it (copies only, as for images).
function wireAudio(clip) {
  const out = (wire, transfer = []) => ({ wire, transfer });
  if (typeof clip === "string") return out({ url: new URL(clip, globalThis.location?.href).href });
  if (clip instanceof Blob) return out({ blob: clip });
  if (clip instanceof ArrayBuffer) return out({ bytes: new Uint8Array(clip) });
  if (ArrayBuffer.isView(clip) && !(clip instanceof Float32Array)) {
    const bytes = copyOf(clip);
    return out({ bytes }, [bytes.buffer]);
  }
  if (typeof AudioBuffer !== "undefined" && clip instanceof AudioBuffer) {
    const samples = interleaved(clip);
    return out({ samples, sampleRate: clip.sampleRate, channels: clip.numberOfChannels }, [samples.buffer]);
  }
  if (clip?.samples instanceof Float32Array) {
    const samples = clip.samples.slice();
    return out({ samples, sampleRate: clip.sampleRate, channels: clip.channels ?? 1 }, [samples.buffer]);
  }
  // OpenAI's `input_audio` payload: base64 file bytes.
  if (typeof clip?.data === "string") {
    let text;
    try {
      text = atob(clip.data);
    } catch {
      throw badRequest("an `input_audio` clip's `data` is not base64");
    }
    const bytes = Uint8Array.from(text, (c) => c.charCodeAt(0));
    return out({ bytes }, [bytes.buffer]);
  }
  throw badRequest(
    "an audio clip must be a File, Blob, ArrayBuffer, Uint8Array, URL string, AudioBuffer or { samples, sampleRate, channels }",
  );
}

// A message for the worker: `images` and `audio` become their counts, content parts lose their
// images and clips; these go to `wire.images` and `wire.audio` in prompt order (each message's
// `images` or `audio`, then its parts of that kind).
async function wireMessage(m, imageTokens, wire) {
  // A message of images or clips alone needs no text.
  const media = (m?.images?.length ?? 0) + (m?.audio?.length ?? 0);
  const out = { role: m?.role, content: m?.content ?? (media ? "" : undefined) };
  const add = async (image, tokens = imageTokens) => wire.images.push(await wireImage(image, tokens));
  if (m?.images != null) {
    if (!Array.isArray(m.images)) throw badRequest("a message's `images` must be an array");
    for (const image of m.images) await add(image);
    if (m.images.length) out.images = m.images.length;
  }
  if (m?.audio != null) {
    if (!Array.isArray(m.audio)) throw badRequest("a message's `audio` must be an array");
    for (const clip of m.audio) wire.audio.push(wireAudio(clip));
    if (m.audio.length) out.audio = m.audio.length;
  }
  if (Array.isArray(m?.content)) {
    out.content = [];
    for (const part of m.content) {
      if (typeof part === "string") {
        out.content.push({ type: "text", text: part });
      } else if (part?.type === "image" || part?.type === "image_url") {
        // `image_url` is OpenAI's (and WebLLM's) shape: `{type, image_url: {url}}`.
        const image = part.type === "image" ? part.image ?? part.url : part.image_url?.url ?? part.image_url;
        await add(image, part.imageTokens ?? imageTokens);
        out.content.push({ type: "image" });
      } else if (part?.type === "audio" || part?.type === "input_audio") {
        wire.audio.push(wireAudio(part.type === "audio" ? part.audio ?? part.url : part.input_audio));
        out.content.push({ type: "audio" });
      } else {
        out.content.push(part);
      }
    }
  }
  return out;
}

// The worker's request object for generate()'s arguments, the images and clips beside it, and
// what to transfer.
async function toRequest(messages, { raw, images, audio, imageTokens, ...rest }) {
  const wire = { images: [], audio: [] };
  let request;
  if (messages !== null && typeof messages === "object" && !Array.isArray(messages)) {
    // Token ids as they are: `{tokens: [2, 651, ...]}` (benchmarks, pre-tokenized prompts).
    if (!Array.isArray(messages.tokens)) throw badRequest("a prompt object holds `tokens`, an array of ids");
    if (images != null || audio != null) throw badRequest("a token prompt takes no `images` or `audio`");
    request = { ...rest, tokens: messages.tokens };
  } else if (typeof messages === "string" && raw) {
    // A raw prompt holds its placeholders (`<|image|>`, `<|audio|>`) itself.
    for (const image of images ?? []) wire.images.push(await wireImage(image, imageTokens));
    for (const clip of audio ?? []) wire.audio.push(wireAudio(clip));
    request = { ...rest, prompt: messages };
  } else {
    if (typeof messages === "string") messages = [{ role: "user", content: messages, images, audio }];
    else if (images != null || audio != null) {
      throw badRequest("`images` and `audio` go with a string prompt; put a message's own on it");
    }
    if (!Array.isArray(messages)) throw badRequest("`messages` must be an array or a string");
    const out = [];
    for (const m of messages) out.push(await wireMessage(m, imageTokens, wire));
    request = { ...rest, messages: out };
  }
  const all = [...wire.images, ...wire.audio];
  return {
    request,
    images: wire.images.map((w) => w.wire),
    audio: wire.audio.map((w) => w.wire),
    transfer: all.flatMap((w) => w.transfer),
  };
}

/** A conversation: its KV cache stays on the GPU between turns. */
export class Session {
  constructor(channel, options) {
    this.channel = channel;
    this.id = nextSession++;
    this.ready = channel.call({ op: "session", session: this.id, options });
    // Surfaced by the first generate(); never an unhandled rejection.
    this.ready.catch(() => {});
    // The work queued on this session: generations and resets run one after another (a
    // generation that was left early is still stopping in the worker).
    this.previous = Promise.resolve();
  }

  // Runs `task` once everything queued before it has settled.
  enqueue(task) {
    const run = this.previous.then(task);
    this.previous = run.catch(() => {});
    return run;
  }

  /**
   * Generates a reply. `messages` is an array of `{role, content, images?, audio?}` (content a
   * string or a list of text, image and audio parts) or one user turn as a string; with `{raw: true}` a
   * string is fed as plain text, without the chat template; `{tokens: [ids]}` feeds token ids as they are. Yields `{type: "token", id, text}`
   * events, then `{type: "done", reason, timings}`; a text diffusion model (DiffusionGemma)
   * also `{type: "draft", block, step, text}` after each denoising step, its block's tokens
   * once the block is done. Leaving the loop early aborts the generation.
   */
  async *generate(messages, options = {}) {
    await this.ready;
    const { request, images, audio, transfer } = await toRequest(messages, options);
    const queue = [];
    let wake = null;
    let finished = false;
    const push = (item) => {
      queue.push(item);
      wake?.();
    };
    this.enqueue(() =>
      this.channel.call(
        { op: "generate", session: this.id, request, images, audio },
        ({ event }) => push({ event }),
        transfer,
      ),
    ).then(
        () => push({ end: true }),
        (error) => push({ error }),
      );
    try {
      for (;;) {
        while (queue.length === 0) await new Promise((r) => (wake = r));
        const item = queue.shift();
        if (item.error) throw item.error;
        if (item.end) {
          finished = true;
          return;
        }
        yield item.event;
      }
    } finally {
      if (!finished) this.abort();
    }
  }

  /** Stops the running generation; it ends with `{type: "done", reason: "aborted"}`. */
  abort() {
    this.channel.send({ op: "abort", session: this.id });
  }

  /**
   * GPU time per kernel of a prefill over `messages` and of one decode step (timestamp
   * queries; null without them): `[{what, tokens, totalUs, kernels: [{name, dispatches, us}]}]`.
   * Messages with images or audio first give each tower's forward (`what: "vision"`, one entry
   * an image; `"audio"`, one a 30 s chunk). Leaves the conversation empty.
   */
  async profile(messages, options = {}) {
    await this.ready;
    const { request, images, audio } = await toRequest(messages, options);
    return await this.enqueue(() =>
      this.channel.call({ op: "profile", session: this.id, request, images, audio }),
    );
  }

  /** Forgets the conversation. */
  async reset() {
    await this.ready;
    await this.enqueue(() => this.channel.call({ op: "reset", session: this.id }));
  }

  /** Frees the session's GPU memory. */
  async close() {
    await this.channel.call({ op: "closeSession", session: this.id });
  }
}

export class WGemma {
  constructor(worker, channel, info) {
    this.worker = worker;
    this.channel = channel;
    this._info = info;
  }

  /**
   * Loads a GGUF from a URL (read with HTTP Range requests and kept in the Cache API unless
   * `cache: false`) or from a `File`/`Blob`; `mmproj` (the same kinds) adds the vision and
   * audio towers of a llama.cpp projector file. `onProgress({loaded, total})` reports weight bytes (of
   * both files) uploaded to the GPU. `knobs` sets the engine's `WGEMMA_*` tuning and debugging
   * switches (the README's environment variables, as strings) for this model.
   */
  static async load(source, { mmproj, onProgress, cache = true, workerUrl, perLayerTable = "gpu", knobs } = {}) {
    const isSource = (s) => typeof s === "string" || s instanceof Blob;
    if (!isSource(source)) throw badRequest("the source must be a URL string or a File/Blob");
    if (perLayerTable !== "gpu" && perLayerTable !== "fetch") {
      throw badRequest('`perLayerTable` must be "gpu" or "fetch"');
    }
    if (mmproj != null && !isSource(mmproj)) throw badRequest("`mmproj` must be a URL string or a File/Blob");
    if (knobs != null && (typeof knobs !== "object" || Object.values(knobs).some((v) => typeof v !== "string"))) {
      throw badRequest("`knobs` must be an object of strings");
    }
    const worker = new Worker(workerUrl ?? new URL("./worker.js", import.meta.url), {
      type: "module",
    });
    const channel = new Channel(worker);
    try {
      const tableOnGpu = perLayerTable === "gpu";
      const info = await channel.call({ op: "load", source, mmproj, cache, tableOnGpu, knobs }, ({ progress }) => {
        if (progress) onProgress?.(progress);
      });
      return new WGemma(worker, channel, info);
    } catch (e) {
      worker.terminate();
      throw e;
    }
  }

  /** The file's metadata, the GPU it runs on, and how the load went. */
  info() {
    return this._info;
  }

  /**
   * One image's soft tokens, what the vision tower hands the text model: `{data, rows, width,
   * ms}`, `data` a Float32Array of `rows` tokens of `width` values. Options: `{imageTokens}`.
   */
  async encodeImage(image, { imageTokens } = {}) {
    const { wire, transfer } = await wireImage(image, imageTokens);
    return await this.channel.call({ op: "encodeImage", image: wire }, undefined, transfer);
  }

  /**
   * One audio clip's soft tokens, what the audio tower hands the text model: `{data, rows,
   * width, ms}` as for an image (a clip over 30 s: each chunk's tokens in turn).
   */
  async encodeAudio(clip) {
    const { wire, transfer } = wireAudio(clip);
    return await this.channel.call({ op: "encodeAudio", audio: wire }, undefined, transfer);
  }

  /** A new conversation; options: `{context, maxBatch}`. */
  session(options = {}) {
    return new Session(this.channel, options);
  }

  /** Frees the model and its worker. */
  dispose() {
    this.channel.failAll(new WGemmaError("disposed", "the model was disposed"));
    this.worker.terminate();
  }
}

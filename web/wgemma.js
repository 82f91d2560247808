// wgemma in the browser: the page-side API. The model lives in a Web Worker (worker.js) that
// runs the wasm engine on WebGPU, so the page stays responsive while weights load and tokens
// are generated.
//
//   const model = await WGemma.load(url or File, { onProgress });
//   const s = model.session({ context: 2048 });
//   for await (const ev of s.generate([{ role: "user", content: "Hi" }], { maxTokens: 64 }))
//     if (ev.type === "token") out.textContent += ev.text;
//   s.abort();   // from elsewhere: the generation ends within one step

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

  call(message, onMessage) {
    const id = this.next++;
    return new Promise((resolve, reject) => {
      this.pending.set(id, { resolve, reject, onMessage });
      this.worker.postMessage({ ...message, id });
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

// The worker's request object for generate()'s arguments.
function toRequest(messages, { raw, ...rest }) {
  if (typeof messages !== "string") return { ...rest, messages };
  return raw ? { ...rest, prompt: messages } : { ...rest, messages: [{ role: "user", content: messages }] };
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
   * Generates a reply. `messages` is an array of `{role, content}` or one user turn as a
   * string; with `{raw: true}` a string is fed as plain text, without the chat template.
   * Yields `{type: "token", id, text}` events, then `{type: "done", reason, timings}`.
   * Leaving the loop early aborts the generation.
   */
  async *generate(messages, options = {}) {
    await this.ready;
    const request = toRequest(messages, options);
    const queue = [];
    let wake = null;
    let finished = false;
    const push = (item) => {
      queue.push(item);
      wake?.();
    };
    this.enqueue(() =>
      this.channel.call({ op: "generate", session: this.id, request }, ({ event }) => push({ event })),
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
   * Leaves the conversation empty.
   */
  async profile(messages, options = {}) {
    await this.ready;
    const request = toRequest(messages, options);
    return await this.enqueue(() => this.channel.call({ op: "profile", session: this.id, request }));
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
   * `cache: false`) or from a `File`/`Blob`. `onProgress({loaded, total})` reports weight
   * bytes uploaded to the GPU.
   */
  static async load(source, { onProgress, cache = true, workerUrl } = {}) {
    if (typeof source !== "string" && !(source instanceof Blob)) {
      throw new WGemmaError("bad_request", "the source must be a URL string or a File/Blob");
    }
    const worker = new Worker(workerUrl ?? new URL("./worker.js", import.meta.url), {
      type: "module",
    });
    const channel = new Channel(worker);
    try {
      const info = await channel.call({ op: "load", source, cache }, ({ progress }) => {
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

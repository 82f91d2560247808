// `cargo xtask dawn-bench`: the page's engine timed in Node on Dawn, the WebGPU of Chrome, on
// the machine's GPU. The same code path as the page: wgemma.js and its worker (web/worker.js,
// in a worker thread) running web/pkg, the GGUF read by HTTP Range requests from a local
// server, sampling and streaming as in the page. Prints one JSON object like `cargo xtask
// bench-e2e`'s: medians over `--reps` runs after a warm-up of prefill and decode tok/s (the
// engine's timings) and time to first token (wall clock, from the request to the first
// token event).
//
//   node bench.mjs --model M.gguf [--prompt 512] [--decode 128] [--reps 3] [--profile]
//                  [--per-layer-table gpu|fetch] [--logprobs N] [--dawn FLAG]...
//
// `--dawn` passes Dawn's flags (`backend=vulkan`, `enable-dawn-features=...`). `--profile`
// adds `profile`: GPU time per kernel of one prefill over the prompt and one decode step, as
// `session.profile` gives it (timestamp queries; Dawn rounds them to 100 us unless given
// `disable-dawn-features=timestamp_quantization`).
import { Worker as NodeWorker } from "node:worker_threads";
import { createServer } from "node:http";
import { open, stat } from "node:fs/promises";
import { parseArgs } from "node:util";

const { values: a } = parseArgs({
  options: {
    model: { type: "string" },
    prompt: { type: "string", default: "512" },
    decode: { type: "string", default: "128" },
    reps: { type: "string", default: "3" },
    dawn: { type: "string", multiple: true, default: [] },
    profile: { type: "boolean", default: false },
    "per-layer-table": { type: "string", default: "gpu" },
    knob: { type: "string", multiple: true, default: [] },
    logprobs: { type: "string", default: "0" },
  },
});
if (!a.model) {
  console.error("usage: bench.mjs --model M.gguf [--prompt N] [--decode N] [--reps N] [--dawn FLAG]... [--knob NAME=VALUE]...");
  process.exit(2);
}
const [promptLen, decode, reps] = [a.prompt, a.decode, a.reps].map(Number);

// The model file over HTTP with Range requests, as a web server gives it to the page.
async function serve(file) {
  const size = (await stat(file)).size;
  const fh = await open(file);
  const server = createServer(async (req, res) => {
    const m = /^bytes=(\d+)-(\d+)$/.exec(req.headers.range ?? "");
    if (!m) {
      res.writeHead(416).end();
      return;
    }
    const start = Number(m[1]);
    const end = Math.min(Number(m[2]), size - 1);
    const buf = Buffer.alloc(end + 1 - start);
    await fh.read(buf, 0, buf.length, start);
    res.writeHead(206, {
      "Content-Range": `bytes ${start}-${end}/${size}`,
      "Content-Length": buf.length,
      ETag: `"${size}"`,
    });
    res.end(buf);
  });
  await new Promise((r) => server.listen(0, "127.0.0.1", r));
  return { server, url: `http://127.0.0.1:${server.address().port}/model.gguf` };
}

const { server, url } = await serve(a.model);

// The browser's module Worker, over a Node worker thread running worker.mjs.
globalThis.Worker = class {
  constructor(workerUrl) {
    this.thread = new NodeWorker(new URL("./worker.mjs", import.meta.url), {
      workerData: { worker: workerUrl.href, base: url, dawn: a.dawn },
    });
    this.thread.on("message", (data) => this.onmessage?.({ data }));
    this.thread.on("error", (e) => this.onerror?.(e));
  }
  postMessage(message, transfer) {
    this.thread.postMessage(message, transfer);
  }
  terminate() {
    this.thread.terminate();
  }
};

const { WGemma } = await import("../wgemma.js");
const median = (v) => [...v].sort((x, y) => x - y)[Math.floor(v.length / 2)];
try {
  const t0 = performance.now();
  // The engine's WGEMMA_* switches, as the page's `knobs` load option sets them.
  const knobs = Object.fromEntries(a.knob.map((k) => [k.split("=")[0], k.slice(k.indexOf("=") + 1)]));
  const model = await WGemma.load(url, { cache: false, perLayerTable: a["per-layer-table"], knobs });
  const loadS = (performance.now() - t0) / 1e3;
  const info = model.info();
  const vocab = info.vocab;
  // The prompt `cargo xtask bench-e2e` feeds: the same ids.
  const tokens = Array.from({ length: promptLen }, (_, i) => (i * 7919 + 13) % vocab);
  const t1 = performance.now();
  const session = model.session({ context: promptLen + decode + 8, maxBatch: Math.min(promptLen, 512) });
  // Creating a session compiles its pipelines (not the first request).
  await session.ready;
  const sessionMs = performance.now() - t1;
  const runs = [];
  let firstTtft = null;
  let firstIds = null;
  let firstTops = null;
  for (let rep = 0; rep <= reps; rep++) {
    await session.reset();
    const start = performance.now();
    let first = null;
    let done = null;
    const ids = [];
    const tops = [];
    const options = { maxTokens: decode, temperature: 0, logprobs: Number(a.logprobs) };
    for await (const ev of session.generate({ tokens }, options)) {
      if (ev.type === "token" && first === null) first = performance.now() - start;
      if (ev.type === "token") {
        ids.push(ev.id);
        if (ev.logprobs) tops.push(ev.logprobs.top);
      }
      if (ev.type === "done") done = ev;
    }
    firstIds ??= ids;
    firstTops ??= tops;
    // The first run warms pipelines and caches; its time to first token is the first
    // request's after the load.
    if (rep === 0) firstTtft = first;
    else runs.push({ ttft: first, ...done.timings });
  }
  const out = {
    model: a.model,
    adapter: info.gpu?.adapter,
    backend: info.gpu?.backend,
    shaderF16: info.gpu?.shaderF16,
    subgroups: info.gpu?.subgroups,
    subgroup_matrix: info.gpu?.subgroupMatrix,
    engine: "wasm+dawn",
    load_s: loadS,
    session_ms: sessionMs,
    prompt_tokens: promptLen,
    decode_tokens: median(runs.map((r) => r.generatedTokens)),
    prefill_tok_s: median(runs.map((r) => r.promptTokPerS)),
    decode_tok_s: median(runs.map((r) => r.decodeTokPerS)),
    ttft_ms: median(runs.map((r) => r.ttft)),
    first_request_ttft_ms: firstTtft,
    // The greedy ids of the first run, to compare engines and devices.
    ids: firstIds,
  };
  // With --logprobs N: each generated token's top N [id, log-probability] of that run.
  if (Number(a.logprobs) > 0) out.top_logprobs = firstTops;
  if (a.profile) out.profile = await session.profile({ tokens });
  console.log(JSON.stringify(out));
  model.dispose();
  const rates = [out.prefill_tok_s, out.decode_tok_s, out.ttft_ms];
  if (!(out.decode_tokens >= 1) || !rates.every((r) => Number.isFinite(r) && r > 0)) {
    console.error("dawn-bench: no tokens, or rates that are not positive numbers");
    process.exitCode = 1;
  }
} finally {
  server.close();
}
process.exit(process.exitCode ?? 0);

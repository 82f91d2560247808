// Drives headless Chromium (WebGPU on SwiftShader) through the JS API and the demo page.
// Run by `cargo xtask browser-test`, which builds the package, serves it, and passes:
//   WGEMMA_URL       the served site                 WGEMMA_CHROMIUM  the browser binary
//   WGEMMA_MODEL     the tiny model's URL path       WGEMMA_REQUEST   the generation request (JSON)
//   WGEMMA_MODEL_FILE  the same model on disk (picked through the file input)
//   WGEMMA_G4_MODEL, WGEMMA_G4_EXPECTED  a tiny Gemma 4 with per-layer embeddings, and the
//                                        native run's tokens for WGEMMA_REQUEST
//   WGEMMA_DTYPE_REQUEST, WGEMMA_DTYPE_CASES  tiny models of every weight dtype
//                                        ([{dtype, model, expected}]) and what they are asked
//   WGEMMA_EXPECTED  the native run's token ids      WGEMMA_OUT       where the screenshot goes
//   WGEMMA_DEMO_REQUEST, WGEMMA_DEMO_EXPECTED        what is typed into the demo page, and the
//                                                    native run's tokens for it
//   WGEMMA_BENCH     optional: a bigger model's URL path to time (load, prefill, decode)
//   WGEMMA_CHROMIUM_ARGS  optional: more browser flags, space-separated
// Prints one JSON line of results; exits non-zero when a check fails.
import { chromium } from "playwright-core";

const env = process.env;
const request = JSON.parse(env.WGEMMA_REQUEST);
const expected = JSON.parse(env.WGEMMA_EXPECTED);
const demoRequest = JSON.parse(env.WGEMMA_DEMO_REQUEST);
const demoExpected = JSON.parse(env.WGEMMA_DEMO_EXPECTED);
const results = { checks: {} };
const failures = [];
const t0 = Date.now();
const elapsed = () => `${((Date.now() - t0) / 1000).toFixed(1)} s`;

// Each check's outcome, and on stderr when it came (where the run's time goes).
function check(name, ok, detail) {
  results.checks[name] = ok ? "ok" : `FAILED: ${detail}`;
  if (!ok) failures.push(`${name}: ${detail}`);
  console.error(`${elapsed()} ${ok ? "ok" : "FAILED"}: ${name}`);
}

const browser = await chromium.launch({
  executablePath: env.WGEMMA_CHROMIUM,
  headless: true,
  args: [
    "--no-sandbox",
    "--disable-gpu-sandbox",
    "--enable-unsafe-webgpu",
    "--enable-features=Vulkan",
    "--use-vulkan=swiftshader",
    "--use-webgpu-adapter=swiftshader",
    "--disable-background-networking",
    "--disable-component-update",
    // Extra flags for experiments, e.g. --enable-dawn-features=disable_robustness.
    ...(env.WGEMMA_CHROMIUM_ARGS ?? "").split(" ").filter(Boolean),
  ],
});
const page = await browser.newPage({ viewport: { width: 1000, height: 800 } });
const log = [];
page.on("console", (m) => {
  log.push(`${m.type()}: ${m.text()}`);
  // The benchmark's milestones, as they happen.
  if (m.text().startsWith("[bench]")) console.error(`${elapsed()} ${m.text()}`);
});
page.on("pageerror", (e) => log.push(`pageerror: ${e.message}`));
// SwiftShader is slow, but no step of the tiny model's checks takes minutes: fail, never hang.
page.setDefaultTimeout(180_000);

try {
  await page.goto(`${env.WGEMMA_URL}/index.html`);

  // The JS API: greedy generation equals the native run; a second load comes from the cache.
  const api = await page.evaluate(
    async ({ model, request }) => {
      const { WGemma } = await import("./wgemma.js");
      await caches.delete("wgemma-models-v1");
      const run = async (session) => {
        const ids = [];
        let done = null;
        const { messages, ...options } = request;
        for await (const ev of session.generate(messages, options)) {
          if (ev.type === "token") ids.push(ev.id);
          else done = ev;
        }
        return { ids, done };
      };
      let progressCalls = 0;
      const t0 = performance.now();
      const m = await WGemma.load(model, { onProgress: () => progressCalls++ });
      const loadMs = performance.now() - t0;
      const first = await run(m.session({ context: 256 }));
      const info = m.info();
      m.dispose();
      const again = await WGemma.load(model);
      const cachedInfo = again.info();
      const second = await run(again.session({ context: 256 }));
      again.dispose();
      return { loadMs, progressCalls, info, cachedLoad: cachedInfo.load, first, second };
    },
    { model: env.WGEMMA_MODEL, request },
  );
  results.adapter = api.info.gpu;
  results.tinyLoadMs = api.loadMs;
  results.tokens = api.first.ids;
  check(
    "greedy tokens equal the native run",
    JSON.stringify(api.first.ids) === JSON.stringify(expected),
    `browser ${JSON.stringify(api.first.ids)} vs native ${JSON.stringify(expected)}`,
  );
  check("load reports progress", api.progressCalls > 0, `${api.progressCalls} progress calls`);
  check(
    "a second load reads only the cache",
    api.cachedLoad.fetchedBytes === 0 && api.cachedLoad.cachedBytes === api.info.file_size,
    JSON.stringify(api.cachedLoad),
  );
  check(
    "the cached model generates the same tokens",
    JSON.stringify(api.second.ids) === JSON.stringify(expected),
    JSON.stringify(api.second.ids),
  );

  // Gemma 4: the per-layer embedding rows come by range requests as tokens are fed.
  const g4 = await page.evaluate(
    async ({ model, request }) => {
      const { WGemma } = await import("./wgemma.js");
      const m = await WGemma.load(model, { cache: false });
      const ids = [];
      const { messages, ...options } = request;
      for await (const ev of m.session({ context: 256 }).generate(messages, options))
        if (ev.type === "token") ids.push(ev.id);
      m.dispose();
      return ids;
    },
    { model: env.WGEMMA_G4_MODEL, request },
  );
  const expected4 = JSON.parse(env.WGEMMA_G4_EXPECTED);
  check(
    "Gemma 4 with per-layer rows fetched by range equals the native run",
    JSON.stringify(g4) === JSON.stringify(expected4),
    `browser ${JSON.stringify(g4)} vs native ${JSON.stringify(expected4)}`,
  );

  // Every weight dtype compiles under Chromium's WGSL compiler and matches native.
  const dtypeRequest = JSON.parse(env.WGEMMA_DTYPE_REQUEST);
  for (const c of JSON.parse(env.WGEMMA_DTYPE_CASES)) {
    const got = await page.evaluate(
      async ({ model, request }) => {
        const { WGemma } = await import("./wgemma.js");
        try {
          const m = await WGemma.load(model, { cache: false });
          const ids = [];
          const { prompt, ...options } = request;
          for await (const ev of m.session({ context: 64 }).generate(prompt, { ...options, raw: true }))
            if (ev.type === "token") ids.push(ev.id);
          m.dispose();
          return ids;
        } catch (e) {
          return `${e.code}: ${e.message}`;
        }
      },
      { model: c.model, request: dtypeRequest },
    );
    check(
      `${c.dtype} weights match the native run`,
      JSON.stringify(got) === JSON.stringify(c.expected),
      `browser ${JSON.stringify(got)} vs native ${JSON.stringify(c.expected)}`,
    );
  }

  // Abort within a step, then the same session still answers, identically.
  const abort = await page.evaluate(
    async ({ model, request }) => {
      const { WGemma } = await import("./wgemma.js");
      const m = await WGemma.load(model);
      const s = m.session({ context: 256 });
      const { messages, ...options } = request;
      const ids = [];
      let done = null;
      for await (const ev of s.generate(messages, { ...options, maxTokens: 200 })) {
        if (ev.type === "token") {
          ids.push(ev.id);
          if (ids.length === 3) s.abort();
        } else done = ev;
      }
      const after = [];
      for await (const ev of s.generate(messages, options)) if (ev.type === "token") after.push(ev.id);
      // Leaving the loop early aborts too; the session answers again afterwards.
      for await (const ev of s.generate(messages, { ...options, maxTokens: 200 })) break;
      const third = [];
      for await (const ev of s.generate(messages, options)) if (ev.type === "token") third.push(ev.id);
      const profile = await s.profile(messages);
      m.dispose();
      return { reason: done?.reason, tokensBeforeStop: ids.length, after, third, profile };
    },
    { model: env.WGEMMA_MODEL, request },
  );
  check(
    "abort stops within a step",
    abort.reason === "aborted" && abort.tokensBeforeStop <= 3 + 2,
    JSON.stringify(abort),
  );
  const p = abort.profile;
  check(
    "profile times the kernels of a prefill and a decode step",
    p === null ||
      (p.length === 2 && p[1].what === "decode" && p.every((s) => s.kernels.length > 0 && s.totalUs > 0)),
    JSON.stringify(p)?.slice(0, 400),
  );
  results.profiled = p !== null;
  delete abort.profile;
  check(
    "the session is usable after abort",
    JSON.stringify(abort.after) === JSON.stringify(expected) &&
      JSON.stringify(abort.third) === JSON.stringify(expected),
    JSON.stringify(abort),
  );

  // Bad sources reject with typed errors.
  const errors = await page.evaluate(async () => {
    const { WGemma } = await import("./wgemma.js");
    const codeOf = (p) =>
      p.then(
        () => "no error",
        (e) => `${e.name}/${e.code}: ${e.message}`,
      );
    return {
      missing: await codeOf(WGemma.load("models/missing.gguf")),
      notGguf: await codeOf(WGemma.load("index.html")),
    };
  });
  check("a missing URL is a source error", errors.missing.startsWith("WGemmaError/source"), errors.missing);

  // A download cut off mid-body: retried, then a clear error, and nothing partial cached.
  const broken = await page.evaluate(async (model) => {
    const { WGemma } = await import("./wgemma.js");
    const url = new URL(`broken/${model}`, location.href).href;
    const outcome = await WGemma.load(url).then(
      () => "loaded",
      (e) => `${e.code}: ${e.message}`,
    );
    const cache = await caches.open("wgemma-models-v1");
    const cached = (await cache.keys()).map((k) => k.url).filter((u) => u.startsWith(url));
    return { outcome, cached };
  }, env.WGEMMA_MODEL);
  check(
    "a dropped download fails clearly and caches nothing partial",
    broken.outcome.startsWith("source: ") && broken.cached.length === 0,
    JSON.stringify(broken),
  );
  check("a non-GGUF file is a bad_gguf error", errors.notGguf.startsWith("WGemmaError/bad_gguf"), errors.notGguf);

  // The demo page, driven like a user: load, ask, watch tokens stream, screenshot.
  await page.goto(`${env.WGEMMA_URL}/index.html`);
  // The page fills the URL field from the server's model list once that arrives; typing
  // before then races with it (the two URLs ended up concatenated).
  await page.waitForFunction(() => document.getElementById("served").options.length > 0);
  await page.fill("#url", env.WGEMMA_MODEL);
  await page.click("#load-url");
  await page.waitForSelector("#prompt:not([disabled])");
  await page.fill("#max-tokens", String(demoRequest.maxTokens));
  await page.fill("#prompt", demoRequest.messages.at(-1).content);
  await page.click("#send");
  await page.waitForFunction(() => window.wgemmaDemo.lastDone !== null);
  const demo = await page.evaluate(() => ({
    tokens: window.wgemmaDemo.lastTokens,
    stats: document.getElementById("stats").textContent,
    reply: document.querySelector(".turn.model")?.textContent,
  }));
  check(
    "the demo page streams the native reply",
    JSON.stringify(demo.tokens) === JSON.stringify(demoExpected),
    `${JSON.stringify(demo)} vs native ${JSON.stringify(demoExpected)}`,
  );
  check("the demo page shows tok/s", /tok\/s/.test(demo.stats), demo.stats);
  results.screenshot = `${env.WGEMMA_OUT}/demo.png`;
  await page.screenshot({ path: results.screenshot, fullPage: true });

  // A file the user picks loads through the same worker, read by Blob slices.
  const urlModel = await page.evaluateHandle(() => window.wgemmaDemo.model);
  await page.setInputFiles("#file", env.WGEMMA_MODEL_FILE);
  await page.waitForFunction(
    (old) => {
      const d = window.wgemmaDemo;
      return (d.model && d.model !== old) || /Could not load/.test(document.getElementById("model-status").textContent);
    },
    urlModel,
  );
  await page.fill("#prompt", demoRequest.messages.at(-1).content);
  const before = await page.evaluate(() => window.wgemmaDemo.lastDone);
  await page.click("#send");
  await page.waitForFunction((b) => window.wgemmaDemo.lastDone !== b && !window.wgemmaDemo.busy, before);
  const picked = await page.evaluate(() => ({
    status: document.getElementById("model-status").textContent,
    tokens: window.wgemmaDemo.lastTokens,
  }));
  check(
    "a picked file loads and answers the same",
    picked.status.includes("loaded in") && JSON.stringify(picked.tokens) === JSON.stringify(demoExpected),
    JSON.stringify(picked),
  );

  if (env.WGEMMA_BENCH) {
    page.setDefaultTimeout(0);
    results.bench = await page.evaluate(
      async ({ model }) => {
        const { WGemma } = await import("./wgemma.js");
        await caches.delete("wgemma-models-v1");
        const load = async (what) => {
          const t0 = performance.now();
          let last = 0;
          const m = await WGemma.load(model, {
            onProgress: ({ loaded, total }) => {
              if (loaded / total >= last + 0.25) {
                last = loaded / total;
                console.log(`[bench] ${what} load ${Math.round(last * 100)}%`);
              }
            },
          });
          const ms = performance.now() - t0;
          console.log(`[bench] ${what} load done in ${ms.toFixed(0)} ms`);
          return { m, ms };
        };
        const cold = await load("cold");
        const s = cold.m.session({ context: 512 });
        let done = null;
        const prompt = "Write a short story about a lighthouse keeper who finds a message in a bottle.";
        for await (const ev of s.generate(prompt, { maxTokens: 16, raw: true })) {
          if (ev.type === "done") done = ev;
          else console.log(`[bench] token ${ev.id}`);
        }
        const profile = await s.profile(prompt, { raw: true });
        console.log("[bench] profiled");
        const info = cold.m.info();
        cold.m.dispose();
        const warm = await load("cached");
        warm.m.dispose();
        return { coldLoadMs: cold.ms, cachedLoadMs: warm.ms, gpu: info.gpu, timings: done.timings, reason: done.reason, profile };
      },
      { model: env.WGEMMA_BENCH },
    );
  }
} catch (e) {
  failures.push(`exception: ${e.stack ?? e}`);
} finally {
  await browser.close();
}

results.failures = failures;
if (failures.length) results.log = log.slice(-40);
console.log(JSON.stringify(results));
process.exit(failures.length ? 1 : 0);

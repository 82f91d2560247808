// Asks a model prompts in headless Chromium (WebGPU on SwiftShader) under sets of the engine's
// switches, and prints each first token's top log-probabilities as one JSON line. Run by
// `cargo xtask browser-probe`, which passes:
//   WGEMMA_URL, WGEMMA_CHROMIUM, WGEMMA_MODEL (URL path), WGEMMA_PROMPTS (JSON strings),
//   WGEMMA_KNOB_SETS (JSON: [{name, knobs}]), WGEMMA_SESSION (the session's options, JSON),
//   WGEMMA_CHROMIUM_ARGS (optional flags)
import { launchChromium } from "./chromium.mjs";

const env = process.env;
const browser = await launchChromium(env);
const page = await browser.newPage();
const log = [];
page.on("console", (m) => log.push(`${m.type()}: ${m.text()}`));
page.on("pageerror", (e) => log.push(`pageerror: ${e.message}`));
page.setDefaultTimeout(600_000);
let code = 0;
try {
  await page.goto(`${env.WGEMMA_URL}/index.html`);
  const sets = [];
  for (const set of JSON.parse(env.WGEMMA_KNOB_SETS)) {
    const firsts = await page.evaluate(
      async ({ model, prompts, knobs, session }) => {
        const { WGemma } = await import("./wgemma.js");
        const m = await WGemma.load(model, { cache: false, knobs });
        const out = [];
        for (const prompt of prompts) {
          let first = null;
          for await (const ev of m.session(session).generate(prompt, { raw: true, maxTokens: 1, logprobs: 20 }))
            if (ev.type === "token" && !first) first = { id: ev.id, top: ev.logprobs.top };
          out.push(first);
        }
        m.dispose();
        return out;
      },
      { model: env.WGEMMA_MODEL, prompts: JSON.parse(env.WGEMMA_PROMPTS), knobs: set.knobs, session: JSON.parse(env.WGEMMA_SESSION) },
    );
    console.error(`${set.name}: done`);
    sets.push({ name: set.name, firsts });
  }
  console.log(JSON.stringify({ sets, log }));
} catch (e) {
  console.log(JSON.stringify({ error: String(e), log }));
  code = 1;
} finally {
  await browser.close();
}
process.exit(code);

// Headless Chromium with WebGPU on SwiftShader, as the browser test and the probe run it:
// WGEMMA_CHROMIUM is the binary, WGEMMA_CHROMIUM_ARGS more flags (space-separated).
import { chromium } from "playwright-core";

export function launchChromium(env) {
  return chromium.launch({
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
      // Extra flags for experiments, e.g. --enable-dawn-features=dump_shaders.
      ...(env.WGEMMA_CHROMIUM_ARGS ?? "").split(" ").filter(Boolean),
    ],
  });
}

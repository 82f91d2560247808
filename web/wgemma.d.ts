// Types of wgemma.js, the page-side API of wgemma in the browser.

export type ErrorCode =
  | "source" // the file could not be read (HTTP error, no Range support, network)
  | "bad_gguf"
  | "unsupported_model"
  | "load"
  | "tokenizer"
  | "chat"
  | "context_overflow"
  | "no_webgpu" // the browser has no WebGPU at all (navigator.gpu)
  | "gpu" // no WebGPU adapter, a lost device, out of GPU memory
  | "forward"
  | "empty_prompt"
  | "bad_token" // a prompt's token id outside the model's vocabulary
  | "bad_request"
  | "bad_image" // an image that cannot be read: corrupt, empty, over 16384 pixels a side
  | "no_vision" // images for a model without a vision tower (load it with `mmproj`)
  | "vision" // the vision tower cannot be loaded or cannot take the image
  | "bad_audio" // an audio clip that cannot be read: corrupt, an unsupported codec, over 10 minutes, NaN samples
  | "no_audio" // audio for a model without an audio tower (Gemma 4 E2B/E4B, with `mmproj`)
  | "audio" // the audio tower cannot be loaded or cannot take the clip
  | "no_tower" // a projector file with neither a vision nor an audio tower
  | "adapter"
  | "busy"
  | "worker"
  | "disposed"
  | "internal";

export class WGemmaError extends Error {
  readonly name: "WGemmaError";
  readonly code: ErrorCode;
}

export interface LoadProgress {
  /** Weight bytes uploaded to the GPU so far. */
  loaded: number;
  total: number;
}

export interface LoadOptions {
  /** A llama.cpp projector file (`mmproj`) whose vision and audio towers let the model read images and hear audio. */
  mmproj?: string | Blob;
  /** Weight bytes of both files uploaded so far. */
  onProgress?: (progress: LoadProgress) => void;
  /** Keep downloaded pieces in the Cache API (default true): a second visit reads no network. */
  cache?: boolean;
  /** Where worker.js lives, when not next to wgemma.js. */
  workerUrl?: string | URL;
  /**
   * Gemma 4 E2B/E4B's per-layer embedding table. `"gpu"` (the default) uploads it whole, so
   * decode steps queue on the GPU without waiting for each token's row: about 1.3x the
   * decode speed of `"fetch"`, for the table's size in GPU memory and download (E2B's: 1.3
   * GB at Q4_K, 2.5 GB at Q8_0). `"fetch"` reads one row per token from the file as tokens are generated:
   * for devices short of memory.
   */
  perLayerTable?: "gpu" | "fetch";
  /**
   * The engine's tuning and debugging switches for this model: the README's `WGEMMA_*`
   * environment variables, e.g. `{ WGEMMA_FUSIONS_OFF: "residual_prologue" }`.
   */
  knobs?: Record<string, string>;
}

export interface ModelInfo {
  architecture: string | null;
  name: string | null;
  file_size: number;
  tensor_count: number;
  parameter_count: number;
  metadata: Record<string, unknown>;
  dtypes: Record<string, { tensors: number; bytes: number }>;
  gpu: {
    adapter: string;
    backend: string;
    /** "Cpu" for SwiftShader and other CPU fallbacks. */
    deviceType: string;
    shaderF16: boolean;
    /** The kernels use subgroups (the adapter has the `subgroups` feature). */
    subgroups: boolean;
    /** Lanes in a subgroup, as the adapter reports them (0 where it does not). */
    subgroupMinSize: number;
    subgroupMaxSize: number;
    /** The side of the f16 subgroup matrices (Dawn's experimental feature, Chrome with
     * `--enable-unsafe-webgpu`) the prompt's products run on; 0 without them. */
    subgroupMatrix: number;
    weightBytes: number;
  };
  load: { ms: number; fetchedBytes: number; cachedBytes: number };
  /** Token ids run below this (a prompt of `{tokens}`); null for a text diffusion model. */
  vocab: number | null;
  /** The vision tower loaded (from `mmproj` or the model file), or null: no images. */
  vision: VisionInfo | null;
  /** The audio tower loaded (from `mmproj` or the model file), or null: no audio. */
  audio: AudioInfo | null;
  /**
   * A text diffusion model (DiffusionGemma, architecture "diffusion-gemma"): its canvas (the
   * tokens of a block) and sampler settings; null for other models.
   */
  diffusion: {
    canvas_length: number;
    max_steps: number;
    t_min: number;
    t_max: number;
    entropy_bound: number;
    stability_threshold: number;
    confidence_threshold: number;
  } | null;
}

export interface AudioInfo {
  layout: "Mmproj" | "OllamaBlob";
  block_count: number;
  embedding_length: number;
  /** The width of a soft token: the text model's. */
  projection_dim: number;
  /** The longest clip taken. */
  maxSeconds: number;
  [key: string]: unknown;
}

/**
 * An audio clip: a WAV, FLAC, MP3 or Ogg/Vorbis file (`File`, `Blob`, `ArrayBuffer`,
 * `Uint8Array`, or a URL string the worker fetches), decoded by the engine as natively; an
 * `AudioBuffer` (what the browser decoded or recorded); interleaved PCM; or OpenAI's
 * `input_audio` payload (base64 file bytes). Mixed to mono and resampled to 16 kHz.
 */
export type AudioSource =
  | Blob
  | ArrayBuffer
  | ArrayBufferView
  | string
  | AudioBuffer
  | { samples: Float32Array; sampleRate: number; channels?: number }
  | { data: string; format?: string };

export interface VisionInfo {
  layout: "Mmproj" | "OllamaBlob";
  block_count: number;
  embedding_length: number;
  /** The width of a soft token: the text model's. */
  projection_dim: number;
  /** The budgets `imageTokens` may take, and the one used without it. */
  imageTokens: number[];
  defaultImageTokens: number;
  [key: string]: unknown;
}

/**
 * An image: a PNG, JPEG, WebP or GIF file (`File`, `Blob`, `ArrayBuffer`, `Uint8Array`, or a
 * URL string the worker fetches), decoded by the engine as natively; or what the browser has
 * decoded (`ImageBitmap`, `ImageData`, a canvas, an `<img>`, a video frame), read as RGBA
 * pixels. Bytes and pixels are copied to the worker; the caller's objects stay usable.
 */
export type ImageSource =
  | Blob
  | ArrayBuffer
  | ArrayBufferView
  | string
  | ImageBitmap
  | ImageData
  | HTMLCanvasElement
  | OffscreenCanvas
  | HTMLImageElement
  | HTMLVideoElement
  | VideoFrame;

/** An image with its own budget (70, 140, 280, 560 or 1120 soft tokens at most). */
export type ImageInput = ImageSource | { image: ImageSource; imageTokens?: number };

/** A part of a message's content: text, or an image where it stands in the text. */
export type ContentPart =
  | string
  | { type: "text"; text: string }
  | { type: "image"; image: ImageSource; imageTokens?: number }
  /** OpenAI's (and WebLLM's) shape. */
  | { type: "image_url"; image_url: { url: string } | string; imageTokens?: number }
  | { type: "audio"; audio: AudioSource }
  /** OpenAI's shape. */
  | { type: "input_audio"; input_audio: { data: string; format?: string } };

export interface SessionOptions {
  /** Positions the KV cache holds (prompt and reply). Default 4096. */
  context?: number;
  /** Prompt tokens per prefill pass. Default 256. */
  maxBatch?: number;
}

export interface Message {
  role: "system" | "user" | "assistant";
  content: string | ContentPart[];
  /** Images that open the message, before its text (Gemma 4's layout). */
  images?: ImageInput[];
  /** Audio clips after the images, before the text. */
  audio?: AudioSource[];
}

export interface GenerateOptions {
  maxTokens?: number;
  /** 0 (the default) is greedy. */
  temperature?: number;
  topK?: number;
  topP?: number;
  minP?: number;
  repeatPenalty?: number;
  frequencyPenalty?: number;
  presencePenalty?: number;
  /** How many recent tokens the penalties look at (default 64). */
  penaltyLastN?: number;
  seed?: number;
  stop?: string[];
  /**
   * Turn control-token text in the messages (`<end_of_turn>` typed by a user) into control
   * tokens. Off by default: message text is plain text; only the chat template adds them.
   */
  parseSpecial?: boolean;
  /** End a reply that repeats the same stretch of text three times in a row (reason "loop"). */
  stopLoops?: boolean;
  /** Generate past end-of-turn tokens until `maxTokens` (for fixed-length benchmarks). */
  ignoreEos?: boolean;
  /**
   * Report each token's log-probability (of the model's distribution) and those of this many
   * most likely tokens (0 to 20) in its event.
   */
  logprobs?: number;
  /** Feed a string prompt as plain text, without the chat template. */
  raw?: boolean;
  /**
   * With a string prompt: its images (for a raw prompt, one per `<|image|>` it holds; else
   * they open the user turn).
   */
  images?: ImageInput[];
  /** With a string prompt: its audio clips, as `images`. */
  audio?: AudioSource[];
  /** The most soft tokens each image becomes unless it says otherwise (default 280). */
  imageTokens?: number;
  /** Text diffusion: most denoising steps a block takes (default: the model's). */
  steps?: number;
  /** Text diffusion: the uncertainty one step may accept (higher: fewer steps). */
  entropyBound?: number;
}

export interface Timings {
  promptTokens: number;
  cachedTokens: number;
  promptMs: number;
  generatedTokens: number;
  decodeMs: number;
  promptTokPerS: number;
  decodeTokPerS: number;
  /** Images this request encoded (those of earlier turns come from the cache), and the vision tower's time on them (part of promptMs). */
  encodedImages: number;
  /** Audio clips this request encoded (their time is in encodeMs too). */
  encodedAudio: number;
  encodeMs: number;
  /** Text diffusion: blocks generated and denoising steps over them (decodeMs is their time). */
  blocks: number;
  denoisingSteps: number;
}

export interface SoftTokens {
  /** `rows` soft tokens of `width` values, row by row. */
  data: Float32Array;
  rows: number;
  width: number;
  /** Decoding, resizing and the tower. */
  ms: number;
}

export type GenerateEvent =
  | {
      type: "token";
      id: number;
      text: string;
      /** With `logprobs`: the token's log-probability, and `[id, logprob]` of the top tokens. */
      logprobs?: { logprob: number; top: [number, number][] };
    }
  | {
      /**
       * Text diffusion: after each denoising step, the block's current best guess; it
       * replaces the draft before, and the block's tokens follow once it is done.
       */
      type: "draft";
      block: number;
      step: number;
      text: string;
    }
  | {
      type: "done";
      reason: "end" | "max_tokens" | "stop_string" | "aborted" | "context_full" | "loop";
      timings: Timings;
    };

export class Session {
  /** Settles when the worker has made the session (its pipelines compiled); rejects if it failed. */
  readonly ready: Promise<void>;
  generate(
    messages: Message[] | string | { tokens: number[] },
    options?: GenerateOptions,
  ): AsyncGenerator<GenerateEvent>;
  abort(): void;
  /**
   * GPU time per kernel of a prefill over `messages` and one decode step, after each image's
   * (`vision`) and each 30 s audio chunk's (`audio`) tower forward; null without timestamp queries.
   */
  profile(
    messages: Message[] | string | { tokens: number[] },
    options?: GenerateOptions,
  ): Promise<
    | {
        what: "vision" | "audio" | "prefill" | "decode";
        tokens: number;
        totalUs: number;
        kernels: { name: string; dispatches: number; us: number }[];
      }[]
    | null
  >;
  reset(): Promise<void>;
  close(): Promise<void>;
}

export class WGemma {
  static load(source: string | Blob, options?: LoadOptions): Promise<WGemma>;
  info(): ModelInfo;
  /** One image's soft tokens (what the vision tower hands the text model). */
  encodeImage(image: ImageInput, options?: { imageTokens?: number }): Promise<SoftTokens>;
  /** One audio clip's soft tokens (what the audio tower hands the text model). */
  encodeAudio(clip: AudioSource): Promise<SoftTokens>;
  /**
   * A new conversation with its own cache. Its GPU pipelines compile now, in the worker,
   * so that the first request does not wait for them: make it before the user's prompt.
   */
  session(options?: SessionOptions): Session;
  dispose(): void;
}

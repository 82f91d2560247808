// Types of wgemma.js, the page-side API of wgemma in the browser.

export type ErrorCode =
  | "source" // the file could not be read (HTTP error, no Range support, network)
  | "bad_gguf"
  | "unsupported_model"
  | "load"
  | "tokenizer"
  | "chat"
  | "context_overflow"
  | "gpu" // no WebGPU adapter, a lost device, out of GPU memory
  | "forward"
  | "empty_prompt"
  | "bad_request"
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
  onProgress?: (progress: LoadProgress) => void;
  /** Keep downloaded pieces in the Cache API (default true): a second visit reads no network. */
  cache?: boolean;
  /** Where worker.js lives, when not next to wgemma.js. */
  workerUrl?: string | URL;
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
    subgroups: boolean;
    weightBytes: number;
  };
  load: { ms: number; fetchedBytes: number; cachedBytes: number };
}

export interface SessionOptions {
  /** Positions the KV cache holds (prompt and reply). Default 4096. */
  context?: number;
  /** Prompt tokens per prefill pass. Default 256. */
  maxBatch?: number;
}

export interface Message {
  role: "system" | "user" | "assistant";
  content: string;
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
  /** Feed a string prompt as plain text, without the chat template. */
  raw?: boolean;
}

export interface Timings {
  promptTokens: number;
  cachedTokens: number;
  promptMs: number;
  generatedTokens: number;
  decodeMs: number;
  promptTokPerS: number;
  decodeTokPerS: number;
}

export type GenerateEvent =
  | { type: "token"; id: number; text: string }
  | {
      type: "done";
      reason: "end" | "max_tokens" | "stop_string" | "aborted" | "context_full";
      timings: Timings;
    };

export class Session {
  generate(messages: Message[] | string, options?: GenerateOptions): AsyncGenerator<GenerateEvent>;
  abort(): void;
  /** GPU time per kernel of a prefill over `messages` and one decode step; null without timestamp queries. */
  profile(
    messages: Message[] | string,
    options?: GenerateOptions,
  ): Promise<
    | { what: "prefill" | "decode"; tokens: number; totalUs: number; kernels: { name: string; dispatches: number; us: number }[] }[]
    | null
  >;
  reset(): Promise<void>;
  close(): Promise<void>;
}

export class WGemma {
  static load(source: string | Blob, options?: LoadOptions): Promise<WGemma>;
  info(): ModelInfo;
  session(options?: SessionOptions): Session;
  dispose(): void;
}

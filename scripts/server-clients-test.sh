#!/usr/bin/env bash
# `wgemma serve` driven by the official `openai` and `ollama` Python clients
# (xtask/scripts/server_clients.py): the tiny random Gemma 4 of the audio fixtures and, when
# the cache has it, the real Gemma 3 270M, on this machine's GPU API (lavapipe in CI).
# Installs the clients into target/client-venv (pinned versions) on first use; needs the
# wgemma binary built (`cargo build -p wgemma-cli`, which `cargo test --workspace` does).
set -euo pipefail
cd "$(dirname "$0")/.."
venv=target/client-venv
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv" 2> /dev/null || {
    scripts/apt-install-missing.sh python3-venv
    python3 -m venv "$venv"
  }
fi
"$venv/bin/python" -c 'import openai, ollama' 2> /dev/null ||
  "$venv/bin/pip" install --quiet openai==3.57.0 ollama==0.6.3
bin=target/debug/wgemma
models=(crates/gemma4-audio/tests/fixtures/gemma4_tiny_audio.gguf)
real=$("$bin" pull 2> /dev/null) && models+=("$real") || {
  [ "${CI:-}" != true ] || { echo "CI: the real Gemma 3 270M is missing (wgemma pull)" >&2; exit 1; }
}
port=$("$venv/bin/python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
args=()
for m in "${models[@]}"; do args+=(--model "$m"); done
WGEMMA_API_KEY=ci-key "$bin" serve "${args[@]}" --port "$port" --context 1024 &
server=$!
trap 'kill $server 2> /dev/null; wait $server 2> /dev/null || true' EXIT
for _ in $(seq 600); do
  "$venv/bin/python" -c "import socket; socket.create_connection(('127.0.0.1', $port), 1)" 2> /dev/null && break
  sleep 0.1
done
"$venv/bin/python" xtask/scripts/server_clients.py "http://127.0.0.1:$port" ci-key "${models[@]}"

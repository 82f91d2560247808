"""The official `openai` and `ollama` Python clients against a running `wgemma serve`.

Usage: server_clients.py BASE_URL API_KEY MODEL [MODEL ...]
(scripts/server-clients-test.sh starts the server and runs this). Each model is driven
through both clients: whole and streamed replies (the same greedy text), stop strings,
log-probabilities, the model listings, and the errors each client raises. Exits non-zero on the first failure.
"""

import sys

import ollama
import openai


def check(cond, what):
    if not cond:
        raise AssertionError(what)


def openai_side(base, key, model):
    client = openai.OpenAI(base_url=base + "/v1", api_key=key, max_retries=0)
    messages = [{"role": "user", "content": "Tell me about the sea."}]
    whole = client.chat.completions.create(
        model=model, messages=messages, max_tokens=12, temperature=0
    )
    text = whole.choices[0].message.content
    check(isinstance(text, str) and text, f"{model}: a reply: {whole}")
    check(whole.usage.completion_tokens <= 12, f"{model}: usage {whole.usage}")
    check(whole.choices[0].finish_reason in ("stop", "length"), f"{whole}")
    stream = client.chat.completions.create(
        model=model,
        messages=messages,
        max_tokens=12,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    check(streamed == text, f"{model}: streamed {streamed!r} != whole {text!r}")
    check(chunks[-1].usage.completion_tokens == whole.usage.completion_tokens, "usage")
    # A stop string from inside the greedy reply cuts it there.
    if len(text) >= 6:
        stop = text[3:5]
        cut = client.chat.completions.create(
            model=model, messages=messages, max_tokens=12, temperature=0, stop=[stop]
        )
        got = cut.choices[0].message.content
        check(got == text[: text.index(stop)], f"{model}: stop {stop!r}: {got!r} of {text!r}")
        check(cut.choices[0].finish_reason == "stop", f"{cut}")
    # Log-probabilities: a token each, its top 2 most likely first, the greedy pick on top.
    lp = client.chat.completions.create(
        model=model, messages=messages, max_tokens=12, temperature=0, logprobs=True, top_logprobs=2
    )
    content = lp.choices[0].logprobs.content
    check(lp.choices[0].message.content == text, f"{model}: logprobs change the reply")
    check(len(content) >= lp.usage.completion_tokens, f"{model}: {len(content)} logprobs")
    for t in content:
        check(len(t.top_logprobs) == 2 and t.top_logprobs[0].logprob >= t.top_logprobs[1].logprob, f"{t}")
        check(t.token == t.top_logprobs[0].token and t.logprob <= 0.0, f"{t}")
    done = client.completions.create(model=model, prompt="The sky is", max_tokens=4, temperature=0)
    check(isinstance(done.choices[0].text, str), f"{done}")
    ids = [m.id for m in client.models.list().data]
    check(model in ids, f"{model} in {ids}")
    try:
        client.chat.completions.create(model="no-such-model:1b", messages=messages)
        check(False, "an unknown model is an error")
    except openai.NotFoundError:
        pass
    try:
        client.chat.completions.create(model=model, messages=messages, n=2)
        check(False, "n=2 is an error")
    except openai.BadRequestError:
        pass
    bad_key = openai.OpenAI(base_url=base + "/v1", api_key="wrong", max_retries=0)
    try:
        bad_key.models.list()
        check(False, "a wrong key is an error")
    except openai.AuthenticationError:
        pass
    return text


def ollama_side(base, key, model, greedy):
    client = ollama.Client(host=base, headers={"Authorization": f"Bearer {key}"})
    messages = [{"role": "user", "content": "Tell me about the sea."}]
    options = {"temperature": 0, "num_predict": 12}
    whole = client.chat(model=model, messages=messages, options=options)
    check(whole.message.content == greedy, f"{model}: ollama {whole.message.content!r} != {greedy!r}")
    check(whole.done and whole.eval_count <= 12, f"{whole}")
    streamed = "".join(
        part.message.content for part in client.chat(model=model, messages=messages, options=options, stream=True)
    )
    check(streamed == greedy, f"{model}: ollama streamed {streamed!r}")
    # Log-probabilities: one entry a token, its top alternatives most likely first, the
    # greedy pick the first of them.
    lp = client.chat(model=model, messages=messages, options=options, logprobs=True, top_logprobs=2)
    check(lp.logprobs and len(lp.logprobs) >= lp.eval_count, f"{model}: ollama logprobs {lp.logprobs}")
    for e in lp.logprobs:
        top = e.top_logprobs or []
        check(len(top) == 2 and top[0].token == e.token and top[0].logprob >= top[1].logprob, f"{e}")
    parts = list(client.generate(model=model, prompt="The sky is", options={"temperature": 0, "num_predict": 4},
                                 logprobs=True, stream=True))
    streamed_lp = [e for p in parts for e in (p.logprobs or [])]
    check(len(streamed_lp) >= 1 and all(e.logprob <= 0 for e in streamed_lp), f"{model}: streamed logprobs {parts}")
    gen = client.generate(model=model, prompt="The sky is", options={"temperature": 0, "num_predict": 4})
    check(isinstance(gen.response, str) and gen.done, f"{gen}")
    names = [m.model for m in client.list().models]
    check(model in names, f"{model} in tags {names}")
    shown = client.show(model)
    check("completion" in (shown.capabilities or []), f"{shown}")
    running = [m.model for m in client.ps().models]
    check(model in running, f"ps {running}")
    try:
        client.chat(model="no-such-model:1b", messages=messages)
        check(False, "an unknown model is an error")
    except ollama.ResponseError as e:
        check(e.status_code == 404, f"{e.status_code}")


def main():
    base, key, models = sys.argv[1], sys.argv[2], sys.argv[3:]
    for model in models:
        greedy = openai_side(base, key, model)
        ollama_side(base, key, model, greedy)
        print(f"{model}: openai and ollama clients agree ({len(greedy)} characters)")


if __name__ == "__main__":
    main()

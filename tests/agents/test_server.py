"""The OpenAI-compatible policy server and its HTTP client, against the engine called directly.

A real (tiny, random) model serves; the reference numbers come from
``BuiltinEngine.generate`` on the same prompt ids, so every equality below
is the server reproducing the engine through HTTP, the batcher and JSON.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import socket
import threading
import time
import urllib.error
import urllib.request

import openai
import pytest
import torch

from hybridflow.agents.batcher import GenerationBatcher
from hybridflow.agents.http_client import CompletionsClient
from hybridflow.agents.server import PolicyServer, engine_generate_fn
from hybridflow.core.data_proto import DataProto
from hybridflow.core.keys import ATTENTION_MASK, INPUT_IDS, RESPONSE_MASK, RESPONSES, ROLLOUT_LOG_PROBS
from hybridflow.core.rollout_batch import left_pad
from hybridflow.workers.models import load_model_and_tokenizer
from hybridflow.workers.rollout import BuiltinEngine, SamplingParams
from hybridflow.workers.rollout.engine import EngineConfig

MODEL = "hybridflow-policy"


def varied_tiny_model() -> tuple:
    """The tiny model and its tokenizer, with large weights: its greedy outputs vary from token to token (the
    default init repeats one token)."""
    torch.manual_seed(0)
    model, tokenizer = load_model_and_tokenizer("builtin:tiny-qwen2", seed=0)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for weight in (p for p in model.parameters() if p.dim() > 1):
            weight.normal_(0.0, 0.35, generator=gen)
    return model, tokenizer


@pytest.fixture(scope="module")
def engine() -> BuiltinEngine:
    torch.set_num_threads(1)
    return BuiltinEngine(*varied_tiny_model())


@pytest.fixture(scope="module")
def calls() -> list[int]:
    """The batch size of every generate call the server made."""
    return []


@pytest.fixture(scope="module")
def server(engine, calls):
    serve = engine_generate_fn(engine)

    def counted(prompts: DataProto) -> DataProto:
        calls.append(len(prompts))
        return serve(prompts)

    with PolicyServer(
        counted, engine.tokenizer, model_name=MODEL, max_wait_s=0.05, max_model_len=64, max_body_bytes=256 * 1024
    ) as running:
        yield running


def direct(
    engine: BuiltinEngine,
    prompt_ids: list[int],
    max_tokens: int,
    *,
    greedy: bool = False,
    seed: int | None = None,
    stops: tuple[int, ...] = (),
) -> tuple[list[int], list[float]]:
    """The engine's own tokens and log-probs for one prompt, no server in between."""
    ids, mask, _ = left_pad([prompt_ids], engine.pad_token_id)
    out = engine.generate(
        DataProto.from_dict({INPUT_IDS: ids, ATTENTION_MASK: mask}),
        sampling=SamplingParams(max_new_tokens=max_tokens),
        greedy=greedy,
        seed=seed,
        stop_token_ids=stops,
    )
    length = int(out.batch[RESPONSE_MASK][0].sum())
    return out.batch[RESPONSES][0, :length].tolist(), out.batch[ROLLOUT_LOG_PROBS][0, :length].tolist()


def post(url: str, body: object, raw: bytes | None = None, method: str = "POST") -> tuple[int, dict]:
    data = raw if raw is not None else json.dumps(body).encode()
    request = urllib.request.Request(
        url, data=data if method == "POST" else None, method=method, headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def test_models_and_health(server):
    client = openai.OpenAI(base_url=server.url, api_key="none")
    assert [m.id for m in client.models.list()] == [MODEL]
    with urllib.request.urlopen(server.url.removesuffix("/v1") + "/health", timeout=10) as response:
        assert response.status == 200


def test_seeded_sampled_completion_equals_the_engine(server, engine):
    client = openai.OpenAI(base_url=server.url, api_key="none")
    prompt = "max(3,8)="
    out = client.completions.create(
        model=MODEL,
        prompt=prompt,
        max_tokens=12,
        temperature=1.0,
        seed=1234,
        logprobs=1,
        extra_body={"return_token_ids": True},
    )
    choice = out.choices[0]
    prompt_ids = engine.tokenizer(prompt, add_special_tokens=False)["input_ids"]
    assert choice.prompt_token_ids == prompt_ids  # a string prompt is tokenized without special tokens
    tokens, log_probs = direct(engine, prompt_ids, 12, seed=1234)
    assert choice.token_ids == tokens
    assert choice.logprobs.token_logprobs == pytest.approx(log_probs, abs=1e-6)
    assert choice.logprobs.tokens == [engine.tokenizer.decode([t]) for t in tokens]
    assert choice.text == engine.tokenizer.decode(tokens, skip_special_tokens=True)
    assert choice.finish_reason == ("stop" if tokens[-1] in engine.eos_token_ids else "length")
    assert (out.usage.prompt_tokens, out.usage.completion_tokens) == (len(prompt_ids), len(tokens))


def test_concurrent_greedy_requests_are_batched_and_equal_the_engine(server, engine, calls):
    prompts = [
        engine.tokenizer(t, add_special_tokens=False)["input_ids"]
        for t in ["7", "max(1,2)=", "(12+4)*3=", "99", "1+1=", "max(3,8,1,5)=", "42", "8*8="]
    ]

    async def ask_all():
        client = openai.AsyncOpenAI(base_url=server.url, api_key="none")
        try:
            return await asyncio.gather(
                *(
                    client.completions.create(
                        model=MODEL,
                        prompt=ids,
                        max_tokens=6 + i,
                        temperature=0,
                        logprobs=0,
                        extra_body={"return_token_ids": True},
                    )
                    for i, ids in enumerate(prompts)
                )
            )
        finally:
            await client.close()

    before = len(calls)
    answers = asyncio.run(ask_all())
    assert len(calls) - before < len(prompts)  # the 8 requests shared calls
    for i, (ids, answer) in enumerate(zip(prompts, answers)):
        tokens, log_probs = direct(engine, ids, 6 + i, greedy=True)
        assert answer.choices[0].token_ids == tokens
        assert answer.choices[0].logprobs.token_logprobs == pytest.approx(log_probs, abs=1e-5)


def test_chat_completion_renders_the_template_and_equals_the_engine(server, engine, calls):
    tokenizer = engine.tokenizer
    messages = [
        {"role": "system", "content": "answer"},
        {"role": "user", "content": [{"type": "text", "text": "2+3?"}]},
    ]
    plain = [messages[0], {"role": "user", "content": "2+3?"}]
    rendered = tokenizer(
        tokenizer.apply_chat_template(plain, add_generation_prompt=True, tokenize=False), add_special_tokens=False
    )["input_ids"]
    templated = tokenizer.apply_chat_template(plain, add_generation_prompt=True, tokenize=True)
    assert rendered == list(getattr(templated, "input_ids", templated))  # rendering then tokenizing adds nothing

    async def chat_four():
        client = openai.AsyncOpenAI(base_url=server.url, api_key="none")
        try:
            return await asyncio.gather(
                *(
                    client.chat.completions.create(
                        model=MODEL,
                        messages=messages,
                        max_completion_tokens=10,
                        temperature=0,
                        logprobs=True,
                        extra_body={"return_token_ids": True},
                    )
                    for _ in range(4)
                )
            )
        finally:
            await client.close()

    before = len(calls)
    answers = asyncio.run(chat_four())
    assert len(calls) - before < 4
    tokens, log_probs = direct(engine, rendered, 10, greedy=True)
    for answer in answers:
        choice = answer.choices[0]
        assert answer.prompt_token_ids == rendered
        assert choice.token_ids == tokens
        assert choice.message.role == "assistant"
        assert choice.message.content == tokenizer.decode(tokens, skip_special_tokens=True)
        assert [c.logprob for c in choice.logprobs.content] == pytest.approx(log_probs, abs=1e-5)
        assert [c.token for c in choice.logprobs.content] == [tokenizer.decode([t]) for t in tokens]
        assert all(c.top_logprobs == [] and c.bytes == list(c.token.encode()) for c in choice.logprobs.content)


def test_requests_wait_for_each_other_until_the_batch_is_full(engine):
    sizes: list[int] = []
    serve = engine_generate_fn(engine)

    def counted(prompts: DataProto) -> DataProto:
        sizes.append(len(prompts))
        return serve(prompts)

    async def four(url: str) -> list:
        client = CompletionsClient(url, greedy=True)
        try:
            return await asyncio.gather(*(client.generate([5, 6 + i], max_tokens=3) for i in range(4)))
        finally:
            await client.close()

    # a long wait: the four go together because the fourth fills the batch, not because time ran out
    with PolicyServer(counted, engine.tokenizer, max_wait_s=30.0, full_batch_size=4) as server:
        assert len(asyncio.run(asyncio.wait_for(four(server.url), timeout=20))) == 4
    assert sizes == [4]


def test_n_samples_share_one_call_seeded_like_the_engine(server, engine, calls):
    prompt_ids = engine.tokenizer("1+2=", add_special_tokens=False)["input_ids"]
    before = len(calls)
    status, body = post(
        server.url + "/completions",
        {"prompt": prompt_ids, "max_tokens": 8, "n": 3, "seed": 77, "logprobs": 1, "return_token_ids": True},
    )
    assert status == 200 and calls[before:] == [3]
    ids = torch.tensor([prompt_ids] * 3)
    out = engine.generate(
        DataProto.from_dict({INPUT_IDS: ids, ATTENTION_MASK: torch.ones_like(ids)}),
        sampling=SamplingParams(max_new_tokens=8),
        seed=77,
    )
    for row, choice in enumerate(body["choices"]):
        length = int(out.batch[RESPONSE_MASK][row].sum())
        assert choice["index"] == row
        assert choice["token_ids"] == out.batch[RESPONSES][row, :length].tolist()
        expected = out.batch[ROLLOUT_LOG_PROBS][row, :length].tolist()
        assert choice["logprobs"]["token_logprobs"] == pytest.approx(expected, abs=1e-6)
    assert len({tuple(c["token_ids"]) for c in body["choices"]}) > 1  # three samples, not one repeated


def test_completions_client_returns_what_the_batcher_does(server, engine):
    prompt_ids = engine.tokenizer("max(9,4)=", add_special_tokens=False)["input_ids"]
    greedy_ids, _ = direct(engine, prompt_ids, 12, greedy=True)
    stop = greedy_ids[3]  # a stop token the greedy answer reaches

    async def both(**sampling):
        client = CompletionsClient(server.url, **sampling)
        batcher = GenerationBatcher(engine_generate_fn(engine), engine.pad_token_id, engine.eos_token_ids, **sampling)
        try:
            over_http = await client.generate(prompt_ids, max_tokens=12, stop_token_ids=[stop])
            direct_call = await batcher.generate(prompt_ids, max_tokens=12, stop_token_ids=[stop])
        finally:
            await client.close()
            await batcher.close()
        return over_http, direct_call

    for sampling in ({"seed": 4321}, {"greedy": True}):
        over_http, direct_call = asyncio.run(both(**sampling))
        assert over_http.token_ids == direct_call.token_ids
        assert over_http.log_probs == pytest.approx(direct_call.log_probs, abs=1e-6)
        assert (over_http.finish_reason, over_http.weight_version) == (direct_call.finish_reason, 0)
    assert over_http.token_ids == greedy_ids[: greedy_ids.index(stop) + 1] and over_http.finish_reason == "stop"


@pytest.mark.parametrize(
    ("path", "body", "param", "message"),
    [
        ("/completions", {"max_tokens": 4}, "prompt", "`prompt` is required"),
        ("/completions", {"prompt": {"text": "1"}}, "prompt", "must be a string, a list of token ids"),
        ("/completions", {"prompt": [1, "2"]}, "prompt", "list of token ids"),
        ("/completions", {"prompt": [10**6]}, "prompt", "outside the vocabulary"),
        ("/completions", {"prompt": "1", "max_tokens": 0}, "max_tokens", "integer in [1, 4096]"),
        ("/completions", {"prompt": "1", "max_tokens": "4"}, "max_tokens", "integer in [1, 4096]"),
        ("/completions", {"prompt": "1", "temperature": -1}, "temperature", "in [0, 2]"),
        ("/completions", {"prompt": "1", "n": 0}, "n", "integer in [1, 64]"),
        ("/completions", {"prompt": "1", "seed": 1.5}, "seed", "integer"),
        ("/completions", {"prompt": "1", "stop_token_ids": 2}, "stop_token_ids", "list of token ids"),
        ("/completions", {"prompt": "1", "stream": True}, "stream", "stream is not supported"),
        ("/completions", {"prompt": "1", "stop": ["\n"]}, "stop", "use stop_token_ids"),
        ("/completions", {"prompt": "1", "return_token_ids": "yes"}, "return_token_ids", "true or false"),
        ("/chat/completions", {"max_tokens": 4}, "messages", "non-empty list"),
        ("/chat/completions", {"messages": "hi"}, "messages", "non-empty list"),
        ("/chat/completions", {"messages": [{"content": "hi"}]}, "messages", "string `role`"),
        ("/chat/completions", {"messages": [{"role": "user", "content": 3}]}, "messages", "must be a string"),
        (
            "/chat/completions",
            {"messages": [{"role": "user", "content": "hi"}], "logprobs": 1},
            "logprobs",
            "true or false",
        ),
        (
            "/chat/completions",
            {"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": -2},
            "max_completion_tokens",
            "integer in [1, 4096]",
        ),
        ("/completions", [1, 2], None, "must be a JSON object"),
        # hostile values that used to be accepted, or end in a 500
        ("/completions", {"prompt": "1", "max_tokens": 10**9}, "max_tokens", "integer in [1, 4096]"),
        ("/completions", {"prompt": "1", "max_tokens": 512}, "max_tokens", "maximum context length is 64 tokens"),
        ("/completions", {"prompt": "1", "seed": 2**64}, "seed", "integer in [-9223372036854775808, "),
        ("/completions", {"prompt": "1", "n": 10**6}, "n", "integer in [1, 64]"),
        ("/completions", {"prompt": "1", "top_p": 0}, "top_p", "in (0, 1]"),
        ("/completions", {"prompt": "1", "logprobs": 10**4}, "logprobs", "integer in [0, 20]"),
        ("/completions", {"prompt": "1", "seed": 10**4000}, "seed", "an integer of 4001 digits"),
    ],
)
def test_bad_requests_get_a_400_with_the_reason(server, path, body, param, message):
    status, answer = post(server.url + path, body)
    assert status == 400
    assert answer["error"]["type"] == "invalid_request_error" and answer["error"]["param"] == param
    assert message in answer["error"]["message"]


def test_errors_through_the_openai_client_and_other_statuses(server):
    client = openai.OpenAI(base_url=server.url, api_key="none", max_retries=0)
    with pytest.raises(openai.BadRequestError, match=r"integer in \[1, 4096\]"):
        client.completions.create(model=MODEL, prompt="1", max_tokens=0)
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        client.completions.create(model="gpt-4", prompt="1")
    assert post(server.url + "/completions", None, raw=b"{not json")[0] == 400
    status, answer = post(server.url + "/nowhere", {})
    assert status == 404 and "Not Found" in answer["error"]["message"]
    assert post(server.url + "/completions", None, method="GET")[0] == 405


def test_a_failing_generate_call_is_a_500_and_the_server_keeps_serving(engine):
    failures = iter([RuntimeError("the rollout workers are gone")])

    def flaky(prompts: DataProto) -> DataProto:
        failure = next(failures, None)
        if failure is not None:
            raise failure
        return engine_generate_fn(engine)(prompts)

    with PolicyServer(flaky, engine.tokenizer) as server:
        status, answer = post(server.url + "/completions", {"prompt": [5, 6], "max_tokens": 2})
        assert status == 500 and "the rollout workers are gone" in answer["error"]["message"]
        status, answer = post(server.url + "/completions", {"prompt": [5, 6], "max_tokens": 2})
        assert status == 200 and answer["choices"][0]["finish_reason"] in ("stop", "length")
    assert server.url is None


def test_a_seed_names_a_stream_and_idle_old_streams_are_forgotten(engine, monkeypatch):
    monkeypatch.setattr("hybridflow.agents.server.MAX_SEED_STREAMS", 2)

    def ask(url: str, seed: int) -> list[int]:
        status, body = post(
            url + "/completions", {"prompt": [5, 6, 7], "max_tokens": 10, "seed": seed, "return_token_ids": True}
        )
        assert status == 200
        return body["choices"][0]["token_ids"]

    with PolicyServer(engine_generate_fn(engine), engine.tokenizer) as server:
        first = {seed: ask(server.url, seed) for seed in (11, 12, 13)}  # 11 is dropped when 13 arrives
        assert ask(server.url, 13) != first[13]  # stream 13's second call: seed 14
        assert ask(server.url, 13) == ask(server.url, 15)  # its third call (seed 15) is a fresh stream 15's first
        assert ask(server.url, 11) == first[11]  # forgotten, so it starts again at 11


@pytest.mark.parametrize("access_log", [False, True])
def test_requests_are_logged_only_with_access_log(engine, caplog, access_log):
    caplog.set_level("INFO", logger="aiohttp.access")
    kwargs = {"access_log": True} if access_log else {}  # the default is off
    with PolicyServer(engine_generate_fn(engine), engine.tokenizer, **kwargs) as server:
        for _ in range(3):
            assert post(server.url + "/completions", {"prompt": [5, 6], "max_tokens": 2})[0] == 200
    lines = [r.getMessage() for r in caplog.records if r.name == "aiohttp.access"]
    assert len([line for line in lines if '"POST /v1/completions HTTP/1.1" 200' in line]) == (3 if access_log else 0)


@pytest.mark.parametrize(
    "raw,says",
    [
        (b'{"prompt": "1", "temperature": NaN}', "NaN is not a JSON value"),
        (b'{"prompt": "1", "temperature": Infinity}', "Infinity is not a JSON value"),
        (b'{"prompt": "1", "temperature": 1e999}', "in [0, 2]"),  # inf as a float literal
        (b"[" * 100_000 + b"]" * 100_000, "nested deeper"),
        (b'{"prompt": "1", "seed": ' + b"7" * 5000 + b"}", "not JSON"),  # past Python's int digit limit
        (b'{"prompt": "1", "max_tokens": 1, "temperature": 0.5, "x": "\\ud800"}', None),  # a lone surrogate: fine
    ],
)
def test_hostile_bodies_get_a_400_never_a_500(server, raw, says):
    status, answer = post(server.url + "/completions", None, raw=raw)
    if says is None:
        assert status == 200, answer
        return
    assert status == 400 and answer["error"]["type"] == "invalid_request_error", answer
    assert says in answer["error"]["message"]


def test_a_body_past_the_limit_is_refused_before_it_is_read_whole(server):
    start = time.monotonic()
    status, answer = post(server.url + "/completions", {"prompt": "7 " * 300_000})  # 600 kB, the limit 256 kB
    assert status == 413 and "Request Entity Too Large" in answer["error"]["message"]
    assert time.monotonic() - start < 2.0
    assert post(server.url + "/completions", {"prompt": "1", "max_tokens": 1})[0] == 200  # and it serves on


# ---------------------------------------------------------------- long requests, disconnects, health under load
STEP_S = 0.01  # each forward of the slow engine below


@pytest.fixture(scope="module")
def never_ending() -> tuple[BuiltinEngine, dict[str, bool]]:
    """The fixture's model (same weights) with no EOS, so a request runs to its ``max_tokens``, and a switch that
    makes every forward take ``STEP_S`` longer: a decode step of a model ~20x the tiny one's, so one call of a
    400-token request takes ~4 s, as a long request on a real model does."""
    model, tokenizer = varied_tiny_model()
    slow = {"on": False}
    model.register_forward_pre_hook(lambda *_: time.sleep(STEP_S) if slow["on"] else None)
    return BuiltinEngine(model, tokenizer, EngineConfig(eos_token_ids=(10**6,))), slow


def timed_post(url: str, body: dict) -> tuple[int, dict, float]:
    """``post`` and the moment (monotonic) its answer came."""
    status, answer = post(url, body)
    return status, answer, time.monotonic()


def test_a_long_request_takes_turns_so_a_short_one_and_health_are_answered_meanwhile(never_ending):
    engine, slow = never_ending
    long_ids, short_ids = [5, 6, 7, 8], [9, 10]
    expected_long, _ = direct(engine, long_ids, 400, greedy=True)  # one call, full speed
    expected_short, _ = direct(engine, short_ids, 4, greedy=True)
    slow["on"] = True
    try:
        with (
            PolicyServer(
                engine_generate_fn(engine),
                engine.tokenizer,
                eos_token_ids=engine.eos_token_ids,
                max_model_len=512,
                max_tokens_limit=500,
                max_tokens_per_call=16,
            ) as server,
            concurrent.futures.ThreadPoolExecutor(2) as pool,
        ):
            url = server.url + "/completions"
            start = time.monotonic()
            long = pool.submit(
                timed_post, url, {"prompt": long_ids, "max_tokens": 400, "temperature": 0, "return_token_ids": True}
            )
            time.sleep(0.5)  # the long one is in the engine by now
            with urllib.request.urlopen(server.url.removesuffix("/v1") + "/health", timeout=10) as response:
                assert response.status == 200
            health_s = time.monotonic() - start - 0.5
            sent = time.monotonic()
            status, short, short_done = timed_post(
                url, {"prompt": short_ids, "max_tokens": 4, "temperature": 0, "return_token_ids": True}
            )
            long_status, long_answer, long_done = long.result(timeout=60)
    finally:
        slow["on"] = False
    assert health_s < 1.0
    assert status == 200 and short["choices"][0]["token_ids"] == expected_short
    assert short_done - sent < 2.0, f"the short request waited {short_done - sent:.1f} s behind the long one"
    assert short_done < long_done - 1.0  # answered while the long one still had seconds to go
    assert long_done - start > 3.0  # (so the long one really was long)
    # 25 slices of 16 give the tokens of one 400-token call (greedy), each slice re-reading its context
    assert long_status == 200 and long_answer["choices"][0]["token_ids"] == expected_long
    assert long_answer["choices"][0]["finish_reason"] == "length"


def test_a_client_that_disconnects_gets_no_more_engine_calls(never_ending):
    engine, slow = never_ending
    starts: list[float] = []
    serve = engine_generate_fn(engine)

    def counted(prompts: DataProto) -> DataProto:
        starts.append(time.monotonic())
        return serve(prompts)

    slow["on"] = True
    try:
        with PolicyServer(
            counted,
            engine.tokenizer,
            eos_token_ids=engine.eos_token_ids,
            max_model_len=512,
            max_tokens_limit=500,
            max_tokens_per_call=16,
        ) as server:
            body = json.dumps({"prompt": [5, 6, 7, 8], "max_tokens": 400, "temperature": 0}).encode()
            host, port = server.url.removeprefix("http://").removesuffix("/v1").split(":")
            with socket.create_connection((host, int(port)), timeout=10) as client:
                client.sendall(
                    b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                    b"Content-Length: %d\r\n\r\n" % len(body) + body
                )
                time.sleep(0.6)  # a few slices in
            left = time.monotonic()
            time.sleep(1.5)  # a 400-token request would still be decoding for ~3 s
            assert starts and starts[0] < left  # it did reach the engine
            late = [s - left for s in starts if s > left + 0.3]  # after the slice in flight when it left
            assert late == [], f"{len(late)} engine calls started after the client left (of {len(starts)})"
            assert post(server.url + "/completions", {"prompt": [5, 6], "max_tokens": 2})[0] == 200  # serves on
    finally:
        slow["on"] = False


def test_batcher_slices_join_into_one_calls_answer_and_a_cancelled_request_is_dropped(never_ending):
    engine, _ = never_ending
    sizes: list[int] = []
    serve = engine_generate_fn(engine)

    in_engine, release = threading.Event(), threading.Event()

    def counted(prompts: DataProto) -> DataProto:
        sizes.append(int(prompts.meta_info["max_new_tokens"]))
        if len(sizes) == 4:  # the second request's first slice: held until the test has cancelled it
            in_engine.set()
            release.wait(timeout=30)
        return serve(prompts)

    async def run() -> tuple[list, list]:
        batcher = GenerationBatcher(
            counted, engine.pad_token_id, engine.eos_token_ids, greedy=True, max_tokens_per_call=8
        )
        try:
            whole = await batcher.generate([5, 6, 7], max_tokens=20)
            cancelled = asyncio.ensure_future(batcher.generate([5, 6, 7], max_tokens=20))
            assert await asyncio.to_thread(in_engine.wait, 30)  # its first slice is in the engine
            cancelled.cancel()
            release.set()
            await asyncio.sleep(0.3)  # time for a second slice, were it to get one
            return whole, sizes[:]
        finally:
            await batcher.close()

    whole, calls = asyncio.run(run())
    tokens, log_probs = direct(engine, [5, 6, 7], 20, greedy=True)
    assert whole.token_ids == tokens and whole.log_probs == pytest.approx(log_probs, abs=1e-5)
    assert whole.finish_reason == "length" and whole.weight_version == 0
    assert calls == [8, 8, 4, 8]  # 20 tokens as 8 + 8 + 4; the cancelled one got its first slice only


@pytest.mark.parametrize(
    "path,body",
    [
        ("/completions", {"prompt": "7+" * 450_000, "max_tokens": 2}),
        ("/chat/completions", {"messages": [{"role": "user", "content": "7+" * 450_000}], "max_tokens": 2}),
    ],
)
def test_health_answers_while_a_900_kb_prompt_is_tokenized(engine, path, body):
    with (
        PolicyServer(engine_generate_fn(engine), engine.tokenizer, max_model_len=512) as server,
        concurrent.futures.ThreadPoolExecutor(1) as pool,
    ):
        big = pool.submit(timed_post, server.url + path, body)  # under the 1 MiB body limit: it is tokenized
        time.sleep(0.2)
        asked = time.monotonic()
        with urllib.request.urlopen(server.url.removesuffix("/v1") + "/health", timeout=30) as response:
            assert response.status == 200
        answered = time.monotonic()
        status, answer, big_done = big.result(timeout=60)
    assert status == 400 and answer["error"]["code"] == "context_length_exceeded"  # 900,000 tokens of 512
    assert answered < big_done  # it was answered while the prompt was being tokenized...
    assert answered - asked < 0.5  # ... at once (1.3 s when the loop's own thread tokenized)

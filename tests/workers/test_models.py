"""Model and tokenizer loading: built-in tiny models, the character tokenizer, local directories."""

from __future__ import annotations

import pytest
import torch

from hybridflow.workers.models import BUILTIN_MODELS, build_char_tokenizer, load_model_and_tokenizer, load_tokenizer


def _param_count(spec) -> int:
    """Parameters of a built-in model counted by hand from its shape (vocab 32, tied embeddings)."""
    h, inter, layers = spec.hidden_size, spec.intermediate_size, spec.num_layers
    head_dim = h // spec.num_heads
    kv = spec.num_kv_heads * head_dim
    attn = h * h + 2 * h * kv + h * h  # q, k, v, o weights
    if spec.family == "qwen2":
        attn += h + 2 * kv  # q, k, v biases
    mlp = 3 * h * inter
    norms = 2 * h
    return 32 * h + layers * (attn + mlp + norms) + h


def test_the_benchmark_shape_is_qwen25_05b_on_the_meta_device():
    from transformers import AutoModelForCausalLM

    from hybridflow.workers.models import load_model_config

    config = load_model_config("builtin:qwen2.5-0.5b-shape")
    with torch.device("meta"):  # 494M parameters: count them without allocating
        model = AutoModelForCausalLM.from_config(config)
    assert (
        config.hidden_size,
        config.num_hidden_layers,
        config.num_attention_heads,
        config.num_key_value_heads,
        config.intermediate_size,
        config.vocab_size,
    ) == (896, 24, 14, 2, 4864, 151_936)
    assert model.num_parameters() == 494_032_768  # Qwen2.5-0.5B's published count


@pytest.mark.parametrize("name", sorted(n for n, spec in BUILTIN_MODELS.items() if spec.vocab_size is None))
def test_builtin_models_have_the_documented_shape(name):
    model, tokenizer = load_model_and_tokenizer(f"builtin:{name}", seed=0)
    spec = BUILTIN_MODELS[name]
    assert model.num_parameters() == _param_count(spec)
    assert model.config.vocab_size == len(tokenizer) == 32
    assert type(model).__name__ == {"qwen2": "Qwen2ForCausalLM", "llama": "LlamaForCausalLM"}[spec.family]
    assert not model.training


def test_builtin_weights_follow_the_seed_and_leave_the_global_rng_alone():
    torch.manual_seed(123)
    expected_next = torch.rand(3)
    torch.manual_seed(123)
    a, _ = load_model_and_tokenizer("builtin:tiny-qwen2", seed=1)
    assert torch.equal(torch.rand(3), expected_next)  # the caller's random stream is untouched
    b, _ = load_model_and_tokenizer("builtin:tiny-qwen2", seed=1)
    c, _ = load_model_and_tokenizer("builtin:tiny-qwen2", seed=2)
    pa, pb, pc = (dict(m.named_parameters()) for m in (a, b, c))
    name = "model.layers.0.self_attn.q_proj.weight"
    assert all(torch.equal(pa[k], pb[k]) for k in pa)
    assert not torch.equal(pa[name], pc[name])


def test_builtin_dtype():
    model, _ = load_model_and_tokenizer("builtin:tiny-llama", dtype=torch.bfloat16, seed=0)
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}


@pytest.mark.parametrize("loader", [load_model_and_tokenizer, load_tokenizer])
def test_unknown_builtin_lists_the_known_names(loader):
    with pytest.raises(ValueError) as err:
        loader("builtin:huge-qwen2")
    message = str(err.value)
    assert "builtin:huge-qwen2" in message
    assert all(f"builtin:{name}" in message for name in BUILTIN_MODELS)


@pytest.mark.parametrize("loader", [load_model_and_tokenizer, load_tokenizer])
def test_missing_directory_says_so(tmp_path, loader):
    missing = tmp_path / "no-such-model"
    with pytest.raises(FileNotFoundError, match="does not exist"):
        loader(str(missing))


@pytest.mark.parametrize("name", ["tiny-qwen2", "tiny-llama"])
def test_local_directory_round_trip(tmp_path, name):
    model, tokenizer = load_model_and_tokenizer(f"builtin:{name}", seed=3)
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    loaded, loaded_tok = load_model_and_tokenizer(str(tmp_path))
    assert type(loaded) is type(model)
    ids = torch.tensor([loaded_tok("max(1,2,3,4)=")["input_ids"]])
    assert ids.tolist() == [tokenizer("max(1,2,3,4)=")["input_ids"]]
    torch.testing.assert_close(loaded(ids).logits, model(ids).logits, rtol=0, atol=0)
    assert loaded_tok.padding_side == "left"
    assert load_tokenizer(str(tmp_path))("max(1,2,3,4)=")["input_ids"] == ids[0].tolist()
    assert load_tokenizer(f"builtin:{name}").get_vocab() == tokenizer.get_vocab()
    assert loaded_tok.apply_chat_template([{"role": "user", "content": "1"}], tokenize=False) == "<bos><|user|>1"


def test_char_tokenizer_ids_and_round_trip():
    tok = build_char_tokenizer()
    assert (tok.pad_token_id, tok.bos_token_id, tok.eos_token_id, tok.unk_token_id) == (0, 1, 2, 3)
    ids = tok("max(3,8)= ?")["input_ids"]
    assert tok.convert_ids_to_tokens(ids) == list("max(3,8)= ?")  # one token per character, no BOS added
    assert tok.decode(ids) == "max(3,8)= ?"
    assert tok.decode([*tok("7")["input_ids"], tok.eos_token_id, tok.pad_token_id], skip_special_tokens=True) == "7"
    assert tok("Q")["input_ids"] == [tok.unk_token_id]


def test_char_tokenizer_chat_template_and_left_padding():
    tok = build_char_tokenizer()
    chat = [{"role": "user", "content": "max(1,2)="}]
    text = tok.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
    assert text == "<bos><|user|>max(1,2)=<|assistant|>"
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert tok.convert_ids_to_tokens(ids) == ["<bos>", "<|user|>", *"max(1,2)=", "<|assistant|>"]
    batch = tok(["12", "1234"], padding=True, return_tensors="pt")
    assert batch["attention_mask"].tolist() == [[0, 0, 1, 1], [1, 1, 1, 1]]
    assert batch["input_ids"][0, :2].tolist() == [tok.pad_token_id] * 2

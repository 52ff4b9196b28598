"""The tiny hybrid model's vocabulary (``loopd_dev.hybrid_model``), on small GGUF files of its own:
the donor's tokenizer cut to a prefix with the merges that make it, the per-token matrices
resized, and the special tokens and the tokens that are not whole text never written."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest

from loopd_dev import hybrid_model

ARCH = "qwen35moe"
EMBED = 4
# A byte-level BPE vocabulary laid out as SmolLM2's: special tokens, single bytes, then one
# token per merge. "Ã" is the byte 0xc3 alone (half of "é"), "Ã©" the whole "é".
TOKENS = ["<|endoftext|>", "<|im_end|>", "a", "b", "Ã", "©", "ab", "Ã©", "aba"]
MERGES = ["a b", "Ã ©", "ab a"]
TYPES = [3, 3, 1, 1, 1, 1, 1, 1, 1]


def write_model(path: Path, vocab: int) -> None:
    writer = gguf.GGUFWriter(path, ARCH)
    writer.add_uint32(f"{ARCH}.vocab_size", vocab)
    writer.add_uint32(f"{ARCH}.block_count", 1)
    writer.add_string("tokenizer.ggml.model", "test")
    rng = np.random.default_rng(1)
    for name in ("token_embd.weight", "output.weight"):
        writer.add_tensor(name, rng.normal(0, 0.1, (vocab, EMBED)).astype(np.float32))
    writer.add_tensor("output_norm.weight", np.ones(EMBED, dtype=np.float32))
    _finish(writer)


def write_tokenizer(path: Path, **overrides: Any) -> None:
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_tokenizer_model(overrides.get("model", "gpt2"))
    writer.add_tokenizer_pre("smollm")
    writer.add_token_list(TOKENS)
    writer.add_token_types(TYPES)
    writer.add_token_merges(MERGES)
    writer.add_bos_token_id(0)
    writer.add_eos_token_id(overrides.get("eos", 1))
    writer.add_chat_template("{{ messages }}")
    _finish(writer)


def _finish(writer: gguf.GGUFWriter) -> None:
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def read(path: Path) -> tuple[dict[str, Any], dict[str, np.ndarray[Any, Any]]]:
    reader = gguf.GGUFReader(path)
    fields = {name: field.contents() for name, field in reader.fields.items()}
    tensors = {t.name: np.array(t.data) for t in reader.tensors}
    return fields, tensors


@pytest.fixture
def sources(tmp_path: Path) -> tuple[Path, Path]:
    model, tokenizer = tmp_path / "model.gguf", tmp_path / "tokenizer.gguf"
    write_model(model, vocab=3)
    write_tokenizer(tokenizer)
    return model, tokenizer


def test_the_model_takes_a_prefix_of_the_tokenizer_and_the_merges_that_make_it(
    sources: tuple[Path, Path], tmp_path: Path
) -> None:
    out = tmp_path / "out.gguf"
    assert hybrid_model.with_vocabulary(*sources, out, vocab_size=8) == 8
    fields, tensors = read(out)
    assert fields["tokenizer.ggml.model"] == "gpt2"
    assert fields["tokenizer.ggml.tokens"] == TOKENS[:8]
    assert fields["tokenizer.ggml.token_type"] == TYPES[:8]
    assert fields["tokenizer.ggml.merges"] == ["a b", "Ã ©"], "the merge making 'aba' is gone"
    assert fields["tokenizer.ggml.eos_token_id"] == 1
    assert "tokenizer.chat_template" not in fields, "the dev server passes its own template"
    assert fields[f"{ARCH}.vocab_size"] == 8
    assert fields[f"{ARCH}.block_count"] == 1, "the model's own keys are kept"
    assert tensors["token_embd.weight"].shape == (8, EMBED)
    assert tensors["output.weight"].shape == (8, EMBED)
    assert tensors["output.weight"].dtype == np.float32
    np.testing.assert_array_equal(tensors["output_norm.weight"], np.ones(EMBED))


def test_special_tokens_and_pieces_of_characters_are_never_written(
    sources: tuple[Path, Path], tmp_path: Path
) -> None:
    out = tmp_path / "out.gguf"
    hybrid_model.with_vocabulary(*sources, out)
    _, tensors = read(out)
    output = tensors["output.weight"]
    silent = [row for row in range(len(TOKENS)) if not output[row].any()]
    assert silent == [0, 1, 4, 5], "the special tokens and the lone bytes of 'é' have no logit"
    embedded = tensors["token_embd.weight"]
    assert all(embedded[row].any() for row in silent), "they are still read as input"


def test_not_whole_text_reads_the_byte_alphabet() -> None:
    # "Ġ" is the space, "âĢ" the first two bytes of U+2019 (a quotation mark), "âĢĻ" all three.
    tokens = ["<|im_end|>", "Ġthe", "¡", "âĢ", "âĢĻ", "ĠÃ", "Ã©"]
    assert hybrid_model.not_whole_text(tokens) == [2, 3, 5]


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"model": "llama"}, "not byte-level BPE"),
        ({"eos": 8}, "eos_token_id 8 is past the 8 kept"),
    ],
)
def test_a_tokenizer_it_was_not_written_for_is_refused(
    tmp_path: Path, overrides: dict[str, Any], message: str
) -> None:
    model, tokenizer = tmp_path / "model.gguf", tmp_path / "tokenizer.gguf"
    write_model(model, vocab=3)
    write_tokenizer(tokenizer, **overrides)
    with pytest.raises(hybrid_model.ModelError, match=message):
        hybrid_model.with_vocabulary(model, tokenizer, tmp_path / "out.gguf", vocab_size=8)


def test_the_command_says_what_is_wrong_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = tmp_path / "model.gguf"
    write_model(model, vocab=3)
    status = hybrid_model.main([str(model), str(model), str(tmp_path / "out.gguf")])
    err = capsys.readouterr().err
    assert status == 2
    assert err == f"hybrid_model: {model} has no tokenizer.ggml.tokens\n"

"""The tiny hybrid model with a real vocabulary: the qwen35moe of ``test-llama-archs``, SmolLM2's
tokenizer.

``test-llama-archs -a qwen35moe`` writes a random-weight model of the production architecture
with a dummy 128-token vocabulary that writes every token as its id in hex. On that vocabulary
the server cannot end a thought: the end of thinking it forces after loopd's thinking cap (the
template's ``\\n</think>``) detokenizes to hex digits, its reasoning parser never sees the closing
tag, and no answer ever comes (docs/production-shape.md). This writes the same model with
SmolLM2's byte-level BPE tokenizer instead (its ``tokenizer.ggml.*`` keys: ChatML's special
tokens, a vocabulary that round-trips any text), the token embedding and output matrices resized
to that vocabulary with random values of the originals' spread. The text stays noise; the
tokenizer is a real one.

Only the first 8,192 of SmolLM2's 49,152 tokens are kept, with the merges that make them: the
output matrix is read whole for every token, and at the full size the tiny model writes a token
in about 1.6 ms instead of 0.5 ms on two cores. SmolLM2's vocabulary lists its special tokens,
then the single bytes, then one token per merge in merge order, each made of earlier tokens, so
a prefix of it with its merges is the tokenizer BPE training would have stopped at: text still
round-trips, in somewhat more tokens.

Two kinds of tokens are never written: their rows of the output matrix are zeros, so their
logit is 0 where the other tokens' top ones are well above it, and with top-k sampling or greedy
decoding the model never picks them. They stay in the vocabulary, for the input.

- Tokens that are not whole UTF-8 text by themselves (single bytes above 0x7f, pieces of a
  character). A trained model writes them only in runs that complete a character; a random one
  would leave broken characters, and the server fails a tool call's stream on them (HTTP 500
  "invalid UTF-8 byte" in the middle of the stream).
- The special tokens (``<|im_end|>``, ``<|endoftext|>``, ``<|im_start|>``, ...). A trained model
  writes them in their place; a random one would end a turn at random, now and then while it
  still thinks, before any answer (1 of 60 capped requests in a trial with a 24-token cap). So,
  as with the dummy vocabulary, the model never ends a thought or an answer by itself:
  ``max_tokens``, a stop string or the thinking cap's control call does.

``scripts/provision.sh`` runs it once, on files it has already provisioned (no network):

    python -m loopd_dev.hybrid_model MODEL.gguf TOKENIZER.gguf OUT.gguf
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import gguf
import numpy as np

# The tensors that have one row per token.
OUTPUT_TENSOR = "output.weight"
VOCAB_TENSORS = ("token_embd.weight", OUTPUT_TENSOR)
TOKENIZER_PREFIX = "tokenizer.ggml."
VOCAB_SIZE = 8192
# The keys that name one token by its id; each must fall inside the kept vocabulary.
TOKEN_ID_KEYS = (
    gguf.Keys.Tokenizer.BOS_ID,
    gguf.Keys.Tokenizer.EOS_ID,
    gguf.Keys.Tokenizer.EOT_ID,
    gguf.Keys.Tokenizer.UNK_ID,
    gguf.Keys.Tokenizer.PAD_ID,
)
# The random rows are the same on every run, so every provisioned copy is the same model.
SEED = 0
# Byte-level BPE (llama.cpp's ``gpt2`` tokenizer model) writes every byte as one printable
# character; this is its table (GPT-2's ``bytes_to_unicode``).
_PRINTABLE = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
_BYTE_OF_CHAR = {
    chr(char): byte
    for byte, char in zip(
        [*_PRINTABLE, *(b for b in range(256) if b not in _PRINTABLE)],
        [*_PRINTABLE, *range(256, 256 + 256 - len(_PRINTABLE))],
        strict=True,
    )
}


class ModelError(RuntimeError):
    """An input is not what this was written for; the message says which and why."""


def with_vocabulary(model: Path, tokenizer: Path, out: Path, vocab_size: int = VOCAB_SIZE) -> int:
    """Write ``model`` to ``out`` with the first ``vocab_size`` tokens of ``tokenizer``'s
    vocabulary (all of them, if it has fewer); returns how many it kept."""
    source = gguf.GGUFReader(model)
    donor = gguf.GGUFReader(tokenizer)
    arch = str(_field(source, model, gguf.Keys.General.ARCHITECTURE).contents())
    vocab_key = f"{arch}.vocab_size"
    old_vocab = int(_field(source, model, vocab_key).contents())
    tokens: list[str] = _field(donor, tokenizer, gguf.Keys.Tokenizer.LIST).contents()
    new_vocab = min(vocab_size, len(tokens))
    kept = _kept_tokenizer(donor, tokenizer, tokens[:new_vocab])
    model_kind = str(_field(donor, tokenizer, gguf.Keys.Tokenizer.MODEL).contents())
    if model_kind != "gpt2":
        raise ModelError(f"{tokenizer}: tokenizer model {model_kind!r}, not byte-level BPE (gpt2)")
    types = kept[gguf.Keys.Tokenizer.TOKEN_TYPE]
    special = [i for i, kind in enumerate(types) if kind == gguf.TokenType.CONTROL]
    silent = sorted({*not_whole_text(tokens[:new_vocab]), *special})

    writer = gguf.GGUFWriter(out, arch)
    for field in source.fields.values():
        if _written_by_writer(field.name) or field.name.startswith("tokenizer."):
            continue
        if field.name == vocab_key:
            continue
        _copy_field(writer, field)
    writer.add_uint32(vocab_key, new_vocab)
    for field in donor.fields.values():
        # The chat template stays out: the dev server passes its own to every preset.
        if field.name.startswith(TOKENIZER_PREFIX):
            _copy_field(writer, field, kept.get(field.name))

    rng = np.random.default_rng(SEED)
    for tensor in source.tensors:
        data: np.ndarray[Any, Any] = np.array(tensor.data)
        if tensor.name in VOCAB_TENSORS:
            data = _resized(tensor.name, data, old_vocab, new_vocab, rng)
        if tensor.name == OUTPUT_TENSOR:
            data[silent] = 0
        writer.add_tensor(tensor.name, data, raw_dtype=tensor.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return new_vocab


def not_whole_text(tokens: list[str]) -> list[int]:
    """The ids of the byte-level BPE ``tokens`` whose bytes are not whole UTF-8 text (a special
    token's text, ``<|im_end|>``, is plain ASCII: whole text)."""
    broken = []
    for token_id, token in enumerate(tokens):
        if not all(char in _BYTE_OF_CHAR for char in token):
            continue  # outside the byte alphabet: text of its own, not bytes
        try:
            bytes(_BYTE_OF_CHAR[char] for char in token).decode("utf-8")
        except UnicodeDecodeError:
            broken.append(token_id)
    return broken


def _field(reader: gguf.GGUFReader, path: Path, key: str) -> gguf.ReaderField:
    field = reader.fields.get(key)
    if field is None:
        raise ModelError(f"{path} has no {key}")
    return field


def _written_by_writer(name: str) -> bool:
    """The header's counts and the architecture, which ``GGUFWriter`` writes itself."""
    return name.startswith("GGUF.") or name == gguf.Keys.General.ARCHITECTURE


def _kept_tokenizer(donor: gguf.GGUFReader, path: Path, tokens: list[str]) -> dict[str, Any]:
    """The tokenizer's arrays cut to ``tokens``: their types, and the merges whose parts and
    result are all kept (BPE applies a merge only when its result is a token)."""
    kept_ids = set(tokens)
    types: list[int] = _field(donor, path, gguf.Keys.Tokenizer.TOKEN_TYPE).contents()
    merges: list[str] = _field(donor, path, gguf.Keys.Tokenizer.MERGES).contents()
    kept_merges = []
    for merge in merges:
        left, _, right = merge.partition(" ")
        if left in kept_ids and right in kept_ids and left + right in kept_ids:
            kept_merges.append(merge)
    for key in TOKEN_ID_KEYS:
        field = donor.fields.get(key)
        if field is not None and int(field.contents()) >= len(tokens):
            raise ModelError(f"{path}: {key} {field.contents()} is past the {len(tokens)} kept")
    return {
        gguf.Keys.Tokenizer.LIST: tokens,
        gguf.Keys.Tokenizer.TOKEN_TYPE: types[: len(tokens)],
        gguf.Keys.Tokenizer.MERGES: kept_merges,
    }


def _copy_field(writer: gguf.GGUFWriter, field: gguf.ReaderField, value: Any = None) -> None:
    """Copy ``field``, or write ``value`` under its name and type."""
    kind = field.types[0]
    contents = field.contents() if value is None else value
    if kind == gguf.GGUFValueType.ARRAY:
        if len(field.types) < 2:
            return  # an empty array: it has no element type to write, and nothing to copy
        writer.add_key_value(field.name, contents, kind, sub_type=field.types[-1])
    else:
        writer.add_key_value(field.name, contents, kind)


def _resized(
    name: str,
    data: np.ndarray[Any, Any],
    old_vocab: int,
    new_vocab: int,
    rng: np.random.Generator,
) -> np.ndarray[Any, Any]:
    if data.ndim != 2 or data.shape[0] != old_vocab or data.dtype.kind != "f":
        raise ModelError(
            f"{name} is {data.dtype} {list(data.shape)}; expected floats, one row per token "
            f"({old_vocab} rows)"
        )
    rows = rng.normal(float(data.mean()), float(data.std()), size=(new_vocab, data.shape[1]))
    return rows.astype(data.dtype)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loopd_dev.hybrid_model", description=__doc__)
    parser.add_argument("model", type=Path, help="the GGUF test-llama-archs wrote")
    parser.add_argument("tokenizer", type=Path, help="a GGUF whose tokenizer to take")
    parser.add_argument("out", type=Path)
    parser.add_argument("--vocab-size", type=int, default=VOCAB_SIZE, help="tokens kept")
    args = parser.parse_args(argv)
    try:
        size = with_vocabulary(args.model, args.tokenizer, args.out, args.vocab_size)
    except (ModelError, OSError, ValueError) as exc:
        print(f"hybrid_model: {exc}", file=sys.stderr)
        return 2
    print(f"hybrid_model: {args.out} with {size} tokens", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

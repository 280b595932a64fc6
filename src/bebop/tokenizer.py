"""Tokenizers in the Hugging Face `tokenizers` format (`tokenizer.json`).

`load_tokenizer(dir)` reads any `tokenizer.json`. `build_char_tokenizer()` makes the embedded
default's character-level tokenizer: one token per printable ASCII character and newline, plus
the special tokens below, each a single id. It is saved in the same `tokenizer.json` format, so
nothing downstream knows it is special.

Special tokens of the embedded default:
    <pad>  padding (never sampled by a trained model)
    <eos>  end of a completion: the stop token
    <unk>  any character outside the alphabet
    <call> </call>  a tool call in the agent task; `</call>` hands control to the environment
    <obs> </obs>    an environment observation (not the policy's tokens)
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from tokenizers import Tokenizer, decoders, models

from bebop.errors import BebopError
from bebop.fileio import atomic_write, atomic_write_text

SPECIAL_TOKENS = ("<pad>", "<eos>", "<unk>", "<call>", "</call>", "<obs>", "</obs>")
ALPHABET = "\n" + "".join(chr(c) for c in range(32, 127))


@dataclass(frozen=True)
class TextCodec:
    """A loaded tokenizer plus the ids bebop needs by name (None where the vocab lacks one)."""

    tokenizer: Tokenizer
    eos_id: int | None
    pad_id: int | None

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.get_vocab_size(with_added_tokens=True)

    def token_id(self, token: str) -> int | None:
        return self.tokenizer.token_to_id(token)

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)


def build_char_tokenizer() -> Tokenizer:
    """Character-level tokenizer: specials first (ids 0..6), then the alphabet."""
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    for ch in ALPHABET:
        vocab[ch] = len(vocab)
    # BPE with no merges splits every input into single characters.
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    tok.add_special_tokens(list(SPECIAL_TOKENS))
    tok.decoder = decoders.Fuse()
    return tok


def _find_id(tok: Tokenizer, candidates: tuple[str, ...]) -> int | None:
    for name in candidates:
        tid = tok.token_to_id(name)
        if tid is not None:
            return tid
    return None


def codec_from_tokenizer(tok: Tokenizer, eos_id: int | None = None) -> TextCodec:
    if eos_id is None:
        eos_id = _find_id(tok, ("<eos>", "<|endoftext|>", "</s>", "<|im_end|>"))
    pad_id = _find_id(tok, ("<pad>", "<|endoftext|>"))
    return TextCodec(tokenizer=tok, eos_id=eos_id, pad_id=pad_id)


def load_tokenizer(model_dir: str | os.PathLike, eos_id: int | None = None) -> TextCodec:
    path = Path(model_dir) / "tokenizer.json"
    if not path.is_file():
        raise BebopError(f"no tokenizer.json in {model_dir}")
    try:
        tok = Tokenizer.from_file(str(path))
    except Exception as exc:  # the library's messages are long; keep the first line
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise BebopError(f"cannot read {path}: {first}") from None
    return codec_from_tokenizer(tok, eos_id)


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json", "merges.txt",
                   "generation_config.json", "chat_template.jinja")


def copy_tokenizer_files(source_dir: str | os.PathLike, model_dir: str | os.PathLike) -> None:
    """Copy the tokenizer (and generation config) files a model directory has into another, atomically."""
    for name in TOKENIZER_FILES:
        src = Path(source_dir) / name
        if src.is_file():
            atomic_write(Path(model_dir) / name, partial(shutil.copyfile, src))  # (tmp) -> copyfile(src, tmp)


def save_tokenizer(tok: Tokenizer, model_dir: str | os.PathLike) -> None:
    """Write tokenizer.json (atomically) and a minimal tokenizer_config.json."""
    model_dir = Path(model_dir)
    atomic_write_text(model_dir / "tokenizer.json", tok.to_str(pretty=True))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<eos>",
              "pad_token": "<pad>", "unk_token": "<unk>", "model_max_length": 1 << 30}
    atomic_write_text(model_dir / "tokenizer_config.json", json.dumps(config, indent=2))

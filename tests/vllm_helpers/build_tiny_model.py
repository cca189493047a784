"""Build a tiny random-weight Llama (hidden 128, 2 layers, 4 heads of dim 32 -- the CPU attention
minimum -- 2 KV heads) with a byte-level BPE tokenizer trained on local text and a chat
template. Run with the vLLM interpreter: python build_tiny_model.py OUT_DIR"""

from __future__ import annotations

import inspect
import json
import sys
from pathlib import Path

CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


def corpus() -> list[str]:
    """Local English-ish text: the docstrings and comments of the standard library."""
    import argparse
    import asyncio
    import collections
    import dataclasses
    import decimal
    import json as json_mod
    import logging
    import pathlib
    import subprocess

    texts = []
    for mod in (argparse, asyncio, collections, dataclasses, decimal, json_mod, logging, pathlib, subprocess):
        texts.append(inspect.getsource(mod))
    return texts


def main(out: Path) -> None:
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    torch.manual_seed(0)
    out.mkdir(parents=True, exist_ok=True)
    specials = ["<s>", "</s>", "<unk>", "<pad>"]
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=1024, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(corpus(), trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>", pad_token="<pad>"
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.model_max_length = 512
    fast.save_pretrained(out)
    config = LlamaConfig(
        vocab_size=len(fast),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        max_position_embeddings=1024,
        bos_token_id=fast.bos_token_id,
        eos_token_id=fast.eos_token_id,
        pad_token_id=fast.pad_token_id,
        tie_word_embeddings=True,
    )
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(out, safe_serialization=True)
    gen = out / "generation_config.json"
    if gen.exists():  # no sampling defaults: the tests set their own
        gen.write_text(json.dumps({"bos_token_id": 0, "eos_token_id": 1}))
    print(json.dumps({"model_dir": str(out), "vocab": len(fast)}))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
